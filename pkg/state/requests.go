package state

import (
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
)

// The transitions a Node request makes to a record: each takes a request
// the node server has validated, and either changes the record to hold its
// intent or refuses it with a classified error (and then the Store.Update it
// runs in changes nothing). A request the record already holds changes
// nothing, so duplicates and retries are answered by the same wait. They
// do no I/O; the reconciler's transitions, once an operation has ended,
// are in transitions.go.

// SingleWriter is the CSI access mode that allows one publish of a volume
// on the node, live or not yet torn down.
const SingleWriter = "SINGLE_NODE_SINGLE_WRITER"

// RequestStage records spec as the volume's stage. The same stage asked
// again is a duplicate, and cancels its own withdrawal (a retry during a
// rollback). It refuses a volume being removed (NOT_FOUND); a filesystem
// stage of a volume whose data may have been written raw (FAILED_PRECONDITION);
// a stage still being torn down (ABORTED: retry later); and another stage
// (ALREADY_EXISTS). A block stage marks the volume as written raw for good
// (Volume.WrittenAs).
func (v *Volume) RequestStage(spec *Stage) error {
	st := v.Stage
	switch {
	case v.Removing:
		return classified.Errorf(classified.KindNotFound, "volume %s is being deleted", v.ID)
	case st == nil && spec.Access == AccessMount && v.Access == AccessBlock:
		// What a workload wrote on a raw block device is never fscked
		// nor mounted by root: a Filesystem PV made for the volume of
		// a Block one (by whoever may create PVs) is refused.
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s was made for or staged as a raw block device, so a workload may have written anything on it: it is not mounted as a filesystem; restore or clone it into a Filesystem volume through a StorageClass with %s: \"true\" instead", v.ID, contract.AllowModeChangeKey)
	case st == nil:
		v.Stage = spec
	case st.SameSpec(spec):
		st.Deleting = false
	case st.Deleting:
		return classified.Errorf(classified.KindAborted, "volume %s is still being unstaged from %s; retry later", v.ID, st.Path)
	case st.Path != spec.Path:
		return classified.Errorf(classified.KindAlreadyExists, "volume %s is already staged at %s", v.ID, st.Path)
	default:
		return classified.Errorf(classified.KindAlreadyExists, "volume %s is already staged at %s with another capability, fs type or mount flags", v.ID, st.Path)
	}
	if spec.Access == AccessBlock {
		// From now on a workload may write anything on the device: the
		// volume's snapshots say so for good.
		v.Access = AccessBlock
	}
	return nil
}

// RequestUnstage withdraws the stage at path. A volume not staged at path
// is left as it is (the kubelet's retry of a finished unstage). It refuses
// while a publish that is not being withdrawn remains (FAILED_PRECONDITION,
// naming its targets).
func (v *Volume) RequestUnstage(path string) error {
	st := v.Stage
	if st == nil || st.Path != path {
		return nil
	}
	var live []string
	for _, t := range v.Targets() {
		if !v.Publishes[t].Deleting {
			live = append(live, t)
		}
	}
	if len(live) > 0 {
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is still published at %s", v.ID, strings.Join(live, ", "))
	}
	st.Deleting = true
	return nil
}

// RequestPublish records spec as the publish at target of the volume
// staged at staging. The same publish asked again is a duplicate, and
// cancels its own withdrawal. It refuses a volume not staged, staged
// elsewhere or with another access type, and a second publish when either
// is SingleWriter (FAILED_PRECONDITION); a publish at target still being
// torn down (ABORTED: retry later); and another publish at target
// (ALREADY_EXISTS).
func (v *Volume) RequestPublish(staging, target string, spec *Publish) error {
	st := v.Stage
	switch {
	case st == nil || st.Deleting:
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is not staged", v.ID)
	case st.Path != staging:
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is staged at %s, not %s", v.ID, st.Path, staging)
	case st.Access != spec.Access:
		return classified.Errorf(classified.KindFailedPrecondition, "volume %s is staged with access type %s, not %s", v.ID, st.Access, spec.Access)
	}
	if p := v.Publishes[target]; p != nil {
		switch {
		case p.SameSpec(spec):
			p.Deleting = false
			return nil
		case p.Deleting:
			return classified.Errorf(classified.KindAborted, "volume %s is still being unpublished from %s; retry later", v.ID, target)
		}
		return classified.Errorf(classified.KindAlreadyExists, "volume %s is already published at %s with other options", v.ID, target)
	}
	for t, p := range v.Publishes {
		if !p.Deleting && (spec.AccessMode == SingleWriter || p.AccessMode == SingleWriter) {
			return classified.Errorf(classified.KindFailedPrecondition, "volume %s is %s and already published at %s", v.ID, SingleWriter, t)
		}
	}
	if v.Publishes == nil {
		v.Publishes = map[string]*Publish{}
	}
	v.Publishes[target] = spec
	return nil
}

// RequestUnpublish withdraws the publish at target. A volume not published
// there is left as it is; it never refuses.
func (v *Volume) RequestUnpublish(target string) error {
	if p := v.Publishes[target]; p != nil {
		p.Deleting = true
	}
	return nil
}

// RequestExpand records bytes as the capacity the staged volume must
// reach. The latest request is the intent: a smaller size (a user
// recovering from a growth that failed) supersedes a larger one. The same
// size asked again is a duplicate unless retry says it failed for good
// before: then it is a new request (Store.Update gives it a new
// generation), tried again since space may have been freed. It refuses a
// volume that is not staged (NOT_FOUND).
func (v *Volume) RequestExpand(bytes int64, retry bool) error {
	if v.Stage == nil || v.Stage.Deleting {
		return classified.Errorf(classified.KindNotFound, "volume %s is not staged", v.ID)
	}
	if v.Expand == nil || v.Expand.Bytes != bytes || retry {
		v.Expand = &Expand{Bytes: bytes}
	}
	return nil
}

// RequestSnapshot records the intent to take snapshot id of the volume,
// kept by it as the leader of group when group is not nil. An intent
// already recorded is kept as it is (a retry waits on the same one). It
// refuses a volume being deleted (NOT_FOUND).
func (v *Volume) RequestSnapshot(id string, group *GroupIntent) error {
	if v.Removing {
		return NotFound(v.ID)
	}
	if v.Snapshots[id] == nil {
		if v.Snapshots == nil {
			v.Snapshots = map[string]*SnapshotIntent{}
		}
		v.Snapshots[id] = &SnapshotIntent{Group: group}
	}
	return nil
}

// RequestIOLimits records limits as the IO limits of the volume: the
// whole of them, which ControllerModifyVolume merges from the limits
// asked before (WantsIOLimits) and the keys its class gives. The limits
// asked already are a duplicate and change nothing; so are no limits of
// a volume never limited. Other limits replace them, and Store.Update
// gives them a new generation. It refuses a volume being deleted
// (NOT_FOUND).
func (v *Volume) RequestIOLimits(limits host.IOLimits) error {
	if v.Removing {
		return NotFound(v.ID)
	}
	v.setIOLimits(limits)
	return nil
}

// setIOLimits makes limits the IO limits asked of the volume, unless
// they are already: the intent asked before then keeps its generation.
func (v *Volume) setIOLimits(limits host.IOLimits) {
	if limits != v.WantsIOLimits() {
		v.IOLimits = &IOLimitsIntent{Limits: limits}
	}
}

// RecordMade records that the volume, called name (kept only when it is
// not its ID: a volume made before IDs named their node has its name as
// its ID), is made as prov in pool (the default pool recorded as none,
// as before pools), for access, held to limits (its class's; none when
// zero); a record that says block already stays so. CreateVolume records
// it before the image is made, so that an image is never accounted as
// another provisioning than it was made with, nor a volume ever used
// before its limits are recorded.
func (v *Volume) RecordMade(name, pool string, prov Provisioning, access AccessType, limits host.IOLimits) {
	v.Provisioning, v.Pool = prov, ""
	v.setIOLimits(limits)
	if v.Access != AccessBlock {
		v.Access = access
	}
	if v.ID != name {
		v.Name = name
	}
	if pool != DefaultPool {
		v.Pool = pool
	}
}

// ForgetMade undoes RecordMade for a volume whose image was not made: the
// record then accounts for nothing.
func (v *Volume) ForgetMade() {
	v.Provisioning, v.Name, v.Pool, v.Access, v.IOLimits = "", "", "", "", nil
}
