package nodeserver

import (
	"context"
	"errors"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// Store is the subset of the desired-state store the node server needs.
type Store interface {
	Get(id string) (*state.Volume, error)
	UpdateUnsynced(id string, fn func(v *state.Volume) error) (*state.Volume, func() error, error)
	Result(id string, key state.IntentKey) (state.Result, bool)
	TerminalFailureFor(id string, key state.IntentKey, gen int64) *classified.Error
	Watch(id string) <-chan struct{}
	Condition(id string) state.Condition
	LastTerminalFailure(id string, key state.IntentKey) (state.TerminalFailure, bool)
}

// Kicker asks the reconciler for work on a volume.
type Kicker interface {
	// Start starts the volume's next step now, from a fresh observation
	// of it (or asks for a pass). It may run the step on the caller's
	// goroutine, and return once it is done.
	Start(id string)
}

// CapacityFunc returns the size of a volume's image; an error matching
// os.ErrNotExist when it has none.
type CapacityFunc func(id string) (int64, error)

// StatFunc returns the usage of the filesystem at path, giving up when ctx
// ends.
type StatFunc func(ctx context.Context, path string) (host.Usage, error)

// Defaults of Config.
const (
	DefaultMaxWait      = 2 * time.Minute
	DefaultStatsTimeout = 5 * time.Second
	// DefaultMaxRequests allows a few requests per volume on a node with
	// a thousand volumes; a waiting request costs a goroutine and a watch.
	DefaultMaxRequests = 2048
)

// Config configures a Server.
type Config struct {
	Store  Store
	Kicker Kicker
	Stat   StatFunc
	// Capacity reads the size of a volume's image (expansion, block stats).
	Capacity CapacityFunc

	// NodeID is reported by NodeGetInfo.
	NodeID string
	// MaxVolumes is reported by NodeGetInfo; 0 means no limit.
	MaxVolumes int64
	// Topology is the node's accessible topology.
	Topology map[string]string
	// Roots are the directories staging and target paths must lie in.
	Roots []string
	// DevicePrefixes are the directories a static volume's device path
	// must lie in; none disables static volumes.
	DevicePrefixes []string
	// MaxWait is the longest an RPC waits when its context has no deadline.
	MaxWait time.Duration
	// StatsTimeout bounds NodeGetVolumeStats' statfs.
	StatsTimeout time.Duration
	// MaxRequests bounds the requests waiting for the reconciler at once.
	MaxRequests int
	// VolumeHealth advertises GET_VOLUME_HEALTH (alpha in CSI v1.13) and
	// serves NodeGetVolumeHealth; without it that RPC is UNIMPLEMENTED.
	VolumeHealth bool
	// VolumeCondition advertises VOLUME_CONDITION (alpha in CSI v1.3 to
	// v1.12) and answers NodeGetVolumeStats with the volume's condition.
	VolumeCondition bool
}

// Server implements csi.NodeServer.
type Server struct {
	csi.UnimplementedNodeServer
	cfg Config
	// slots holds a token per waiting request (MaxRequests of them).
	slots chan struct{}
}

var _ csi.NodeServer = (*Server)(nil)

// New validates cfg, fills defaults and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Kicker == nil || cfg.Stat == nil || cfg.Capacity == nil {
		return nil, errors.New("nodeserver: store, kicker, stat and capacity are required")
	}
	if cfg.NodeID == "" {
		return nil, errors.New("nodeserver: node ID is required")
	}
	if len(cfg.Roots) == 0 {
		return nil, errors.New("nodeserver: at least one allowed root is required")
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.MaxRequests <= 0 {
		cfg.MaxRequests = DefaultMaxRequests
	}
	if cfg.StatsTimeout <= 0 {
		cfg.StatsTimeout = DefaultStatsTimeout
	}
	return &Server{cfg: cfg, slots: make(chan struct{}, cfg.MaxRequests)}, nil
}

// NodeGetCapabilities implements csi.NodeServer.
func (s *Server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		// Marked alpha in the spec, yet known to every peer since CSI
		// v1.5 and what Kubernetes' ReadWriteOncePod (GA in v1.29)
		// relies on: not behind a feature.
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	}
	if s.cfg.VolumeCondition {
		types = append(types, rpcVolumeCondition)
	}
	if s.cfg.VolumeHealth {
		types = append(types, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH)
	}
	for _, c := range types {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo implements csi.NodeServer.
func (s *Server) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.cfg.NodeID,
		MaxVolumesPerNode:  s.cfg.MaxVolumes,
		AccessibleTopology: &csi.Topology{Segments: s.cfg.Topology},
	}, nil
}

// Waiting returns how many requests hold a slot (wait for the
// reconciler) now.
func (s *Server) Waiting() int { return len(s.slots) }

// MaxRequests returns how many requests may wait at once.
func (s *Server) MaxRequests() int { return cap(s.slots) }

// admit takes a slot for a request that will wait for the reconciler, or
// refuses it with RESOURCE_EXHAUSTED when MaxRequests already wait (the
// kubelet retries). The caller must call release once done.
func (s *Server) admit() (release func(), err error) {
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, nil
	default:
		return nil, classified.Errorf(classified.KindResourceExhausted, "%d requests are already waiting; retry later", s.cfg.MaxRequests)
	}
}

// request serves a Node request the handler has validated: it admits it,
// records the intent transition makes (a named request transition of the
// state package), and waits for the check await builds from the recorded
// record. A nil check (nothing to wait for) answers OK at once.
func (s *Server) request(ctx context.Context, id string, transition func(v *state.Volume) error, await func(v *state.Volume) check) error {
	release, err := s.admit()
	if err != nil {
		return err
	}
	defer release()
	v, err := s.record(id, transition)
	if err != nil {
		return err
	}
	c := await(v)
	if c == nil {
		return nil
	}
	return s.wait(ctx, id, c)
}

// record writes the intent fn makes and starts the volume's work on it,
// which overlaps the write's fdatasync, then returns once the record is
// durable: no request is answered OK on an intent a crash could lose. When
// the fdatasync fails the work may have been done already, so the answer
// is UNAVAILABLE, which the kubelet treats as uncertain: it retries, or
// later calls the reverse.
func (s *Server) record(id string, fn func(v *state.Volume) error) (*state.Volume, error) {
	v, durable, err := s.cfg.Store.UpdateUnsynced(id, fn)
	if err != nil {
		return nil, err
	}
	// The volume's step is decided and started on another goroutine, and
	// the write's fdatasync runs here meanwhile: the flush, the longest
	// part of a quick request, begins at once, and the operation overlaps
	// it.
	go s.cfg.Kicker.Start(id)
	if err := durable(); err != nil {
		return nil, classified.Errorf(classified.KindUnavailable, "the request for volume %s could not be made durable; restart the plugin: %w", id, err)
	}
	return v, nil
}
