package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

const (
	// DriverName is converge's CSI driver name.
	DriverName = "converge.csi.dev"
	// TopologyKey is the one key of converge's topology: the node's name.
	TopologyKey = "topology.converge.csi.dev/node"
	// provisionerIdentityKey is the volume attribute in which
	// external-provisioner names itself.
	provisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"
)

// provisionerFlags are the flags of csi-provisioner v6.3.0
// (cmd/csi-provisioner) its stand-in reads, with the release's defaults.
// newProvisionerConfig refuses the values it does not implement.
var provisionerFlags = map[string]flagSpec{
	"csi-address":                       csiFlag,
	"node-deployment":                   {boolFlag, "false"},
	"node-deployment-immediate-binding": {boolFlag, "true"},
	"strict-topology":                   {boolFlag, "false"},
	// Either value does the same: with --node-deployment the release
	// provisions only a claim whose selected node is its own, and the
	// flag applies only without a selected node
	// (GenerateAccessibilityRequirements).
	"immediate-topology":      {boolFlag, "true"},
	"enable-capacity":         {boolFlag, "false"},
	"capacity-ownerref-level": {intFlag, "1"},
	"extra-create-metadata":   {boolFlag, "false"},
	"leader-election":         {boolFlag, "false"},
	"timeout":                 {durationFlag, "10s"},
}

// provisionerConfig is what the provisioner's stand-in does, from its
// flags and its environment, as csi-provisioner v6.3.0 reads them.
type provisionerConfig struct {
	csiAddress string
	// node is NODE_NAME: the one node whose claims it provisions
	// (--node-deployment).
	node string
	// capacity publishes a CSIStorageCapacity per StorageClass of the
	// driver (--enable-capacity), in namespace (NAMESPACE).
	capacity  bool
	namespace string
	// ownerPod, when set, is the pod (POD_NAME, in namespace) that owns
	// those objects (--capacity-ownerref-level=0).
	ownerPod string
	// extraCreateMetadata adds the claim's and the volume's names to
	// CreateVolume's parameters (--extra-create-metadata).
	extraCreateMetadata bool
	// timeout bounds each call to the driver (--timeout).
	timeout time.Duration
}

// newProvisionerConfig reads a and getenv as csi-provisioner v6.3.0 does,
// and refuses what the stand-in does not implement: it provisions as one
// of deploy/'s node-deployed instances, for its own node alone.
func newProvisionerConfig(a args, getenv func(string) string) (provisionerConfig, error) {
	cfg := provisionerConfig{
		csiAddress:          a.string("csi-address"),
		node:                getenv("NODE_NAME"),
		capacity:            a.bool("enable-capacity"),
		extraCreateMetadata: a.bool("extra-create-metadata"),
		timeout:             a.duration("timeout"),
	}
	switch {
	case !a.bool("node-deployment"):
		return cfg, errors.New("the stand-in implements only --node-deployment=true: each node's instance provisions the claims of its node")
	case cfg.node == "":
		// As the release exits.
		return cfg, errors.New("the NODE_NAME environment variable must be set when using --node-deployment")
	case a.bool("node-deployment-immediate-binding"):
		// The release's default: every node's instance waits a random
		// delay, up to --node-deployment-base-delay, then tries to take
		// a claim of an Immediate class for its node if GetCapacity says
		// it fits, and the first to set the selected node wins.
		return cfg, errors.New("the stand-in implements only --node-deployment-immediate-binding=false: a claim of an Immediate class is left to whatever selects its node")
	case !a.bool("strict-topology"):
		return cfg, errors.New("the stand-in implements only --strict-topology=true: CreateVolume asks for the selected node's topology alone")
	case a.bool("leader-election"):
		// One elected instance would provision only the claims of its
		// own node.
		return cfg, errors.New("the stand-in implements only --leader-election=false: every node's instance works for its node")
	}
	if cfg.capacity {
		if cfg.namespace = getenv("NAMESPACE"); cfg.namespace == "" {
			return cfg, errors.New("need NAMESPACE env variable for CSIStorageCapacity objects")
		}
		if level := a.int("capacity-ownerref-level"); level != 0 {
			return cfg, fmt.Errorf("the stand-in implements only --capacity-ownerref-level=0 (the pod owns its CSIStorageCapacity objects), not %d", level)
		}
		if cfg.ownerPod = getenv("POD_NAME"); cfg.ownerPod == "" {
			return cfg, errors.New("need POD_NAME env variable to determine CSIStorageCapacity owner")
		}
	}
	return cfg, nil
}

// provisioner does what external-provisioner does in deploy/, with
// --node-deployment (its image cannot be fetched here): for a claim of a
// converge StorageClass whose selected node is this node (the scheduler's
// choice, for WaitForFirstConsumer), it calls CreateVolume on csi-node
// and creates the bound PersistentVolume; for a released volume of this
// node it calls DeleteVolume and deletes the PersistentVolume; and, with
// --enable-capacity, it publishes the node's CSIStorageCapacity from
// GetCapacity. The kubelet is not involved; what it does with the volumes
// is what the suite tests.
type provisioner struct {
	provisionerConfig
	client kubernetes.Interface
	// dynamic reads the snapshot API's objects (VolumeSnapshot,
	// VolumeSnapshotContent), whose typed client is not the suite's.
	dynamic dynamic.Interface
	ctrl    csi.ControllerClient
	// owner, when set, owns the CSIStorageCapacity objects it makes, so
	// that they go with it.
	owner *metav1.OwnerReference
	// identity is what external-provisioner writes beside the volume
	// context into every PV's attributes, under provisionerIdentityKey:
	// its start in milliseconds, a random number and the driver's name.
	identity string
	// log receives each pass's errors.
	log io.Writer
}

// newProvisioner makes the provisioner of cfg, which calls the driver
// through ctrl, and looks up the owner of its CSIStorageCapacity
// objects, which must exist.
func newProvisioner(ctx context.Context, cfg provisionerConfig, client kubernetes.Interface, dyn dynamic.Interface, ctrl csi.ControllerClient, log io.Writer) (*provisioner, error) {
	p := &provisioner{provisionerConfig: cfg, client: client, dynamic: dyn, ctrl: ctrl, log: log,
		identity: fmt.Sprintf("%d-%d-%s", time.Now().UnixMilli(), rand.IntN(10000), DriverName)}
	if cfg.ownerPod != "" {
		pod, err := client.CoreV1().Pods(cfg.namespace).Get(ctx, cfg.ownerPod, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("look up owner(s) of pod: %w", err)
		}
		p.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}
	}
	return p, nil
}

// pass is one round of the provisioner's work: capacity (when due),
// claims, released volumes. It says whether the capacity was published.
func (p *provisioner) pass(ctx context.Context, capacityDue bool) bool {
	published := false
	if p.capacity && capacityDue {
		published = p.note(p.publishCapacity(ctx))
	}
	p.note(p.provision(ctx))
	p.note(p.reclaim(ctx))
	return published
}

// run passes every 200 ms, and publishes the capacity every second, until
// ctx ends. A step that fails (csi-node is being restarted, say) is
// retried at the next pass.
func (p *provisioner) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	lastCapacity := time.Time{}
	for {
		if p.pass(ctx, time.Since(lastCapacity) > time.Second) {
			lastCapacity = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// note logs err, if any, and says whether there was none.
func (p *provisioner) note(err error) bool {
	if err == nil {
		return true
	}
	fmt.Fprintln(p.log, time.Now().Format("15:04:05.000"), err)
	return false
}

// runProvisioner does what external-provisioner does in deploy/, for the
// node of NODE_NAME, with the pod's service account.
func runProvisioner(ctx context.Context, a args) error {
	cfg, err := newProvisionerConfig(a, os.Getenv)
	if err != nil {
		return err
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	conn, err := csiConn(cfg.csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	p, err := newProvisioner(ctx, cfg, client, dyn, csi.NewControllerClient(conn), os.Stderr)
	if err != nil {
		return err
	}
	p.run(ctx)
	return nil
}
