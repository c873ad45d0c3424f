package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// resizerFlags are the flags of csi-resizer v2.2.1 (cmd/csi-resizer, and
// csi-lib-utils v0.24.0's standard flags) its stand-in reads, with the
// release's defaults. newResizerConfig refuses the values it does not
// implement.
var resizerFlags = map[string]flagSpec{
	"csi-address":               csiFlag,
	"leader-election":           {boolFlag, "false"},
	"leader-election-namespace": {stringFlag, ""},
	"timeout":                   {durationFlag, "10s"},
}

// resizerConfig is what the resizer's stand-in does, from its flags.
type resizerConfig struct {
	csiAddress string
	// elect makes the instance work only while it holds the Lease
	// ResizerLease in namespace (--leader-election,
	// --leader-election-namespace).
	elect     bool
	namespace string
	// timeout bounds each ControllerExpandVolume (--timeout).
	timeout time.Duration
}

// newResizerConfig reads a as csi-resizer v2.2.1 does, and refuses what
// the stand-in does not implement.
func newResizerConfig(a args) (resizerConfig, error) {
	cfg := resizerConfig{
		csiAddress: a.string("csi-address"),
		elect:      a.bool("leader-election"),
		namespace:  a.string("leader-election-namespace"),
		timeout:    a.duration("timeout"),
	}
	if cfg.elect && cfg.namespace == "" {
		// The release then elects in the namespace of its service
		// account, which the stand-in does not look up.
		return cfg, errors.New("the stand-in implements --leader-election=true only with --leader-election-namespace")
	}
	return cfg, nil
}

// Leader election as csi-lib-utils v0.24.0 runs it with its standard
// flags' defaults (--leader-election-lease-duration, -renew-deadline,
// -retry-period), which the stand-in does not read.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 5 * time.Second
)

// ResizerLease is the Lease external-resizer elects its leader on:
// "external-resizer-" and the driver's name with dots made dashes.
var ResizerLease = "external-resizer-" + strings.ReplaceAll(DriverName, ".", "-")

// ResizerLeading starts the line the resizer's stand-in logs when it
// takes the Lease.
const ResizerLeading = "acquired lease"

// resizer expands volumes as external-resizer does (resize), while it
// leads.
type resizer struct {
	client kubernetes.Interface
	ctrl   csi.ControllerClient
	// timeout bounds each ControllerExpandVolume.
	timeout time.Duration
	// leads is true while this instance works for the cluster: at once
	// without leader election, while it holds the Lease with it.
	leads atomic.Bool
	log   io.Writer
}

// newResizer makes the resizer of cfg, which calls the driver through
// ctrl: leading at once unless it is to be elected.
func newResizer(cfg resizerConfig, client kubernetes.Interface, ctrl csi.ControllerClient, log io.Writer) *resizer {
	r := &resizer{client: client, ctrl: ctrl, timeout: cfg.timeout, log: log}
	r.leads.Store(!cfg.elect)
	return r
}

// lease is the lock the instance of cfg is elected on, under identity.
func (cfg resizerConfig) lease(client kubernetes.Interface, identity string) *resourcelock.LeaseLock {
	return &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: ResizerLease, Namespace: cfg.namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
}

// run resizes every 200 ms while the resizer leads, until ctx ends. A
// resize that fails is retried at the next pass.
func (r *resizer) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if r.leads.Load() {
			if err := r.resize(ctx); err != nil {
				fmt.Fprintln(r.log, time.Now().Format("15:04:05.000"), err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// runResizer does what external-resizer does in deploy/, with the pod's
// service account: with --leader-election, only while it holds the Lease
// ResizerLease of --leader-election-namespace, which it keeps until it
// expires when the holder stops (ReleaseLeaderElectionOnExit is off by
// default).
func runResizer(ctx context.Context, a args) error {
	cfg, err := newResizerConfig(a)
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
	conn, err := csiConn(cfg.csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	r := newResizer(cfg, client, csi.NewControllerClient(conn), os.Stderr)
	if !cfg.elect {
		r.run(ctx)
		return nil
	}
	id, _ := os.Hostname()
	go r.run(ctx)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: cfg.lease(client, id), LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				fmt.Fprintf(os.Stderr, "%s: leading\n", ResizerLeading)
				r.leads.Store(true)
			},
			OnStoppedLeading: func() { r.leads.Store(false) },
		},
	})
	// As csi-lib-utils' leader election does: a lost lease ends the
	// process, and the container starts again as a candidate.
	if ctx.Err() == nil {
		return errors.New("leader election lost")
	}
	return nil
}

// resize does for the suite what external-resizer does in deploy/ (its
// image cannot be fetched here), with Kubernetes' recovery from expansion
// failures (GA since 1.34): for a bound claim of a converge volume whose
// request exceeds its capacity, it records the size being allocated and
// ControllerResizeInProgress, calls ControllerExpandVolume, sets the
// PersistentVolume's capacity, and then either leaves the rest to the
// kubelet (NodeResizePending with the FileSystemResizePending condition,
// when node expansion is required) or finishes the resize. A failure is
// recorded with the ControllerResizeError condition, as
// ControllerResizeInfeasible for a final code (the user must change the
// request) and still ControllerResizeInProgress otherwise, and retried.
func (r *resizer) resize(ctx context.Context) error {
	claims, err := r.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// Each claim on its own, as in reclaim.
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		want, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
		if pvc.Status.Phase != corev1.ClaimBound || want.Cmp(have) <= 0 {
			continue
		}
		switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
		case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
			if a := pvc.Status.AllocatedResources[corev1.ResourceStorage]; a.Cmp(want) >= 0 {
				continue // the kubelet's turn
			}
		}
		pv, err := r.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != DriverName {
			continue
		}
		if err := r.resizeOne(ctx, pvc, pv, want); err != nil {
			errs = append(errs, fmt.Errorf("resize %s/%s: %w", pvc.Namespace, pvc.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *resizer) resizeOne(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, want resource.Quantity) error {
	claims := r.client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	// As external-resizer does, every change is a patch (deploy/'s RBAC
	// grants patch, not update, on volumes and claims' status): the
	// strategic merge patch from what was read to what is wanted.
	patchStatus := func(old, c *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
		data, err := twoWayPatch(old, c, corev1.PersistentVolumeClaim{})
		if err != nil {
			return nil, err
		}
		return claims.Patch(ctx, old.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status")
	}
	mark := func(old *corev1.PersistentVolumeClaim, st corev1.ClaimResourceStatus, cond corev1.PersistentVolumeClaimConditionType, msg string) (*corev1.PersistentVolumeClaim, error) {
		c := old.DeepCopy()
		if c.Status.AllocatedResources == nil {
			c.Status.AllocatedResources = corev1.ResourceList{}
		}
		c.Status.AllocatedResources[corev1.ResourceStorage] = want
		if c.Status.AllocatedResourceStatuses == nil {
			c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
		}
		c.Status.AllocatedResourceStatuses[corev1.ResourceStorage] = st
		c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: cond, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(), Message: msg}}
		return patchStatus(old, c)
	}
	pvc, err := mark(pvc, corev1.PersistentVolumeClaimControllerResizeInProgress, corev1.PersistentVolumeClaimResizing, "")
	if err != nil {
		return err
	}
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER}}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}
	}
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.ctrl.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: pv.Spec.CSI.VolumeHandle, CapacityRange: &csi.CapacityRange{RequiredBytes: want.Value()}, VolumeCapability: vc,
	})
	if err != nil {
		st := corev1.PersistentVolumeClaimControllerResizeInProgress
		switch status.Code(err) {
		case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
			st = corev1.PersistentVolumeClaimControllerResizeInfeasible
		}
		if _, merr := mark(pvc, st, corev1.PersistentVolumeClaimControllerResizeError, err.Error()); merr != nil {
			return merr
		}
		return fmt.Errorf("ControllerExpandVolume: %w", err)
	}
	got := *resource.NewQuantity(resp.CapacityBytes, resource.BinarySI)
	grown := pv.DeepCopy()
	grown.Spec.Capacity[corev1.ResourceStorage] = got
	data, err := twoWayPatch(pv, grown, corev1.PersistentVolume{})
	if err != nil {
		return err
	}
	if _, err := r.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}); err != nil {
		return err
	}
	if resp.NodeExpansionRequired {
		_, err = mark(pvc, corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimFileSystemResizePending,
			"Waiting for user to (re-)start a pod to finish file system resize of volume on node.")
		return err
	}
	done := pvc.DeepCopy()
	done.Status.Capacity[corev1.ResourceStorage] = got
	delete(done.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
	done.Status.Conditions = nil
	_, err = patchStatus(pvc, done)
	return err
}

// twoWayPatch is the strategic merge patch that makes old into new, objects
// of the type of kind.
func twoWayPatch(old, new, kind any) ([]byte, error) {
	o, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	n, err := json.Marshal(new)
	if err != nil {
		return nil, err
	}
	return strategicpatch.CreateTwoWayMergePatch(o, n, kind)
}
