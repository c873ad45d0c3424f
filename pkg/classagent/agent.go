package classagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Config is what an Agent needs.
type Config struct {
	Client kubernetes.Interface
	Scope  Scope
	// Modify hands a class's parameters to this node's csi-node
	// (ControllerModifyVolume); an error is retried with backoff.
	Modify func(ctx context.Context, h Hand) error
	// Resync is how often every volume of the node is handed again.
	Resync time.Duration
	// Events tells a claim's owner that its class could not be handed.
	Events record.EventRecorder
	// SyncTimeout bounds the wait for the caches at start: an agent that
	// cannot read the API exits rather than run without a word.
	SyncTimeout time.Duration
	// RetryBase is the first retry's delay, doubled at each failure up to
	// five minutes.
	RetryBase time.Duration
	// Synced, if set, is called once the caches hold the whole cluster,
	// before the first volume is handed: from then on the agent hands
	// (its /readyz). Not called when Run ends before.
	Synced func()
	// Metrics counts what the agent does; nil counts nothing.
	Metrics *Metrics
}

// Warning reasons of the agent's events.
const (
	// ReasonNotApplied: the volume's node refused the class the claim
	// names, failTimes in a row; the event quotes its answer. It is told
	// again at each resync's hand-off that fails while the failure
	// lasts: an event goes from the API after an hour.
	ReasonNotApplied = "VolumeAttributesClassNotApplied"
	failTimes        = 3
	// ReasonHandleShared: more than one PV of the node names the
	// volume's handle, and the volume is handed no class until one of
	// them goes (checkShared); told once per set of such PVs on the
	// claim of each of them that is bound to one.
	ReasonHandleShared = "VolumeHandleShared"
)

// Agent watches the cluster's PersistentVolumes, their claims and the
// VolumeAttributesClasses, and hands each volume of its node the class its
// claim's spec names (Scope.Decide).
type Agent struct {
	cfg     Config
	factory informers.SharedInformerFactory
	synced  []cache.InformerSynced
	volumes corelisters.PersistentVolumeLister
	claims  corelisters.PersistentVolumeClaimLister
	classes storagelisters.VolumeAttributesClassLister
	// byHandle indexes the PVs by handleKey.
	byHandle cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]
	// handed is the class each PV was last handed ("" for none), skipped
	// why it was not, to log a change once; the worker's alone.
	handed, skipped map[string]string
	// shared holds, for each volume handle that more than one PV of the
	// node names, those PVs' names as last logged; the worker's alone.
	shared map[string][]string
	// resyncs counts the resyncs; told holds, for each PV whose hand
	// keeps failing, the count when its claim was last told (the
	// worker's alone): told once per resync at most.
	resyncs atomic.Int64
	told    map[string]int64
}

// handleIndex is the index of the PVs by handleKey.
const handleIndex = "handle"

// handleKey is what every PV of one volume names: its driver and handle.
func handleKey(pv *corev1.PersistentVolume) string {
	return pv.Spec.CSI.Driver + "/" + pv.Spec.CSI.VolumeHandle
}

func indexHandle(o any) ([]string, error) {
	if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Spec.CSI != nil {
		return []string{handleKey(pv)}, nil
	}
	return nil, nil
}

// New makes an Agent; Run starts it.
func New(cfg Config) *Agent {
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = 2 * time.Minute
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = time.Second
	}
	f := informers.NewSharedInformerFactory(cfg.Client, 0)
	a := &Agent{cfg: cfg, factory: f, handed: map[string]string{}, skipped: map[string]string{}, shared: map[string][]string{}, told: map[string]int64{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "classagent"})}
	pvs := f.Core().V1().PersistentVolumes().Informer()
	pvcs := f.Core().V1().PersistentVolumeClaims().Informer()
	// Every node's agent caches the cluster's volumes and claims: only
	// what Decide reads is kept.
	for _, inf := range []cache.SharedIndexInformer{pvs, pvcs} {
		if err := inf.SetTransform(slim); err != nil {
			panic(err) // only before the informer starts
		}
	}
	if err := pvs.AddIndexers(cache.Indexers{handleIndex: indexHandle}); err != nil {
		panic(err) // only before the informer starts
	}
	a.byHandle = pvs.GetIndexer()
	pvsHandled, _ := pvs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.addVolume(o) },
		UpdateFunc: func(_, o any) { a.addVolume(o) },
		// Queued to be forgotten.
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			a.addVolume(o)
		},
	})
	pvcsHandled, _ := pvcs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.addClaim(o) },
		UpdateFunc: func(_, o any) { a.addClaim(o) },
	})
	// A class is made once and never changes its parameters: one that
	// appears may be what a volume waited for.
	vacs := f.Storage().V1().VolumeAttributesClasses().Informer()
	vacsHandled, _ := vacs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { a.addAll() }})
	// Synced once the handlers, not only the caches, have had every
	// object of the first lists: else a handler's add came after the
	// worker had taken start-up's, and the volume was handed twice.
	a.synced = []cache.InformerSynced{pvsHandled.HasSynced, pvcsHandled.HasSynced, vacsHandled.HasSynced}
	a.volumes = f.Core().V1().PersistentVolumes().Lister()
	a.claims = f.Core().V1().PersistentVolumeClaims().Lister()
	a.classes = f.Storage().V1().VolumeAttributesClasses().Lister()
	return a
}

// addVolume queues pv, if it is the node's, and the node's other PVs of
// its handle: a PV that comes or goes with the handle of another changes
// what that one is handed (sharers).
func (a *Agent) addVolume(o any) {
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || !a.cfg.Scope.Mine(pv) {
		return
	}
	a.queue.Add(pv.Name)
	for _, name := range a.sharers(pv) {
		a.queue.Add(name)
	}
}

// sharers returns, sorted, the names of the node's PVs in the cache that
// name pv's handle, pv among them if it is there.
func (a *Agent) sharers(pv *corev1.PersistentVolume) []string {
	objs, _ := a.byHandle.ByIndex(handleIndex, handleKey(pv))
	var names []string
	for _, o := range objs {
		if other, ok := o.(*corev1.PersistentVolume); ok && a.cfg.Scope.Mine(other) {
			names = append(names, other.Name)
		}
	}
	slices.Sort(names)
	return names
}

// addClaim queues the volume pvc is bound to, if it is the node's and
// bound to pvc: a claim anyone makes naming another's volume queues
// nothing.
func (a *Agent) addClaim(o any) {
	pvc, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok || pvc.Spec.VolumeName == "" {
		return
	}
	pv, err := a.volumes.Get(pvc.Spec.VolumeName)
	if err != nil || !a.cfg.Scope.Mine(pv) {
		return
	}
	if ref := pv.Spec.ClaimRef; ref != nil && ref.UID == pvc.UID && ref.Namespace == pvc.Namespace && ref.Name == pvc.Name {
		a.queue.Add(pv.Name)
	}
}

// slim keeps of a PV or a claim only what Decide reads.
func slim(o any) (any, error) {
	switch x := o.(type) {
	case *corev1.PersistentVolume:
		x.ManagedFields, x.Annotations, x.Labels = nil, nil, nil
		x.Status = corev1.PersistentVolumeStatus{}
	case *corev1.PersistentVolumeClaim:
		x.ManagedFields, x.Annotations, x.Labels = nil, nil, nil
		x.Status = corev1.PersistentVolumeClaimStatus{}
	}
	return o, nil
}

// addAll queues every volume of the node.
func (a *Agent) addAll() {
	pvs, _ := a.volumes.List(labels.Everything())
	for _, pv := range pvs {
		if a.cfg.Scope.Mine(pv) {
			a.queue.Add(pv.Name)
		}
	}
}

// Run watches and hands until ctx ends. It hands nothing before its
// caches hold the whole cluster.
func (a *Agent) Run(ctx context.Context) error {
	// The informers stop with Run, whatever ends it: Shutdown waits for
	// them, and an agent whose caches did not fill returns with ctx live.
	ctx, stop := context.WithCancel(ctx)
	defer a.factory.Shutdown()
	defer stop()
	defer a.queue.ShutDown()
	a.factory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, a.cfg.SyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), a.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("the caches of PersistentVolumes, claims and VolumeAttributesClasses did not fill within %s: can this node's account list and watch them?", a.cfg.SyncTimeout)
	}
	log := klog.FromContext(ctx)
	log.Info("Handing the node's volumes their VolumeAttributesClass", "driver", a.cfg.Scope.Driver, "node", a.cfg.Scope.Node)
	if a.cfg.Synced != nil {
		a.cfg.Synced()
	}
	// Every volume queued once before the worker takes one: the
	// handlers' first adds are queued already, and a volume queued again
	// after the worker took it would be handed twice.
	a.addAll()
	go func() {
		for a.next(ctx) {
		}
	}()
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.resync()
		}
	}
}

// resync queues every volume of the node, as the start of a resync
// period: a hand that fails from then on is told again (next).
func (a *Agent) resync() {
	a.resyncs.Add(1)
	a.addAll()
}

// next hands one queued volume; false once the queue is shut down.
func (a *Agent) next(ctx context.Context) bool {
	name, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(name)
	if claim, err := a.hand(ctx, name); err != nil {
		tries := a.queue.NumRequeues(name) + 1
		log := klog.FromContext(ctx)
		log.Error(err, "Handing the volume its class failed; retrying", "pv", name, "tries", tries)
		a.cfg.Metrics.handFailed()
		if claim != nil && a.tell(name, tries) {
			a.tellClaim(log, claim, name, tries, err)
		}
		a.queue.AddRateLimited(name)
		return true
	}
	delete(a.told, name)
	a.queue.Forget(name)
	return true
}

// tell reports whether the claim of PV name, whose hand failed tries
// times in a row, is to be told now: at the failTimes-th try, and then at
// the first try of each resync period (the resync's own hand-off), never
// at the backoff's retries in between.
func (a *Agent) tell(name string, tries int) bool {
	if tries < failTimes {
		return false
	}
	now := a.resyncs.Load()
	if last, ok := a.told[name]; ok && last == now {
		return false
	}
	a.told[name] = now
	return true
}

// tellClaim posts the Warning event that PV name's node did not apply
// the class claim names, and logs that it did.
func (a *Agent) tellClaim(log klog.Logger, claim *corev1.PersistentVolumeClaim, name string, tries int, err error) {
	if a.cfg.Events == nil {
		return
	}
	what := fmt.Sprintf("apply class %q to", ClassOf(claim))
	if ClassOf(claim) == "" {
		what = "lift the IO limits (the claim names no class) of"
	}
	a.cfg.Events.Eventf(claim, corev1.EventTypeWarning, ReasonNotApplied,
		"node %s did not %s volume %s (%d tries; its node agent retries, and tells again each resync while it fails): %v", a.cfg.Scope.Node, what, name, tries, err)
	log.Info("Told the claim its volume's class is not applied", "pv", name, "claim", klog.KObj(claim), "class", ClassOf(claim), "tries", tries, "reason", ReasonNotApplied)
}

// checkShared says why pv, which the agent would hand a class, is handed
// nothing: another PV of the node names its volume's handle too; "" when
// none does. Two PVs of one volume are one too many: with the node policy
// off, a stolen node's credentials can make a PV pinned to this node with
// the handle of one of its volumes, pre-bound to a claim of a class the
// thief chose, and the volume would get that class. Which of the two is
// the true one is not the agent's to guess, so neither is handed until
// one goes. Once per set of PVs this is logged at level 0, naming them,
// and told on the claim of each that is bound to one (tellShared): the
// refusal keeps the true claim's class from its volume too, which a
// stolen node can thus cause, and its owner must hear of it.
func (a *Agent) checkShared(log klog.Logger, pv *corev1.PersistentVolume) string {
	key, names := handleKey(pv), a.sharers(pv)
	if len(names) < 2 {
		delete(a.shared, key)
		return ""
	}
	if !slices.Equal(a.shared[key], names) {
		log.Info("Handing nothing to a volume whose handle more than one PV of this node names: delete the one not made by its provisioner", "volumeID", pv.Spec.CSI.VolumeHandle, "pvs", names)
		a.shared[key] = names
		a.tellShared(log, pv.Spec.CSI.VolumeHandle, names)
	}
	return fmt.Sprintf("its handle %s is named by PVs %s", pv.Spec.CSI.VolumeHandle, strings.Join(names, ", "))
}

// tellShared posts a Warning event on the claim of each of the PVs names
// that is bound to one, saying that they all name handle and that none
// is handed its class until one goes. A PV bound to no claim, or whose
// claim is not in the cache, is told nowhere but in the log.
func (a *Agent) tellShared(log klog.Logger, handle string, names []string) {
	if a.cfg.Events == nil {
		return
	}
	for _, name := range names {
		pv, err := a.volumes.Get(name)
		if err != nil {
			continue
		}
		claim := a.boundClaim(pv)
		if claim == nil {
			continue
		}
		a.cfg.Events.Eventf(claim, corev1.EventTypeWarning, ReasonHandleShared,
			"node %s hands no VolumeAttributesClass to volume %s, whose handle PVs %s all name: its IO limits stay as they are until one of those PVs goes: delete the one its provisioner did not make (one made by hand, or with a node's credentials where the node admission policy is off)",
			a.cfg.Scope.Node, handle, strings.Join(names, ", "))
		log.Info("Told the claim its volume's handle is shared", "pv", name, "claim", klog.KObj(claim), "volumeID", handle, "reason", ReasonHandleShared)
	}
}

// boundClaim is the claim in the cache that pv is bound to (its claimRef
// names it, with its UID, and it names pv back); nil for none.
func (a *Agent) boundClaim(pv *corev1.PersistentVolume) *corev1.PersistentVolumeClaim {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil
	}
	claim, err := a.claims.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
	if err != nil || claim.UID != ref.UID || claim.Spec.VolumeName != pv.Name {
		return nil
	}
	return claim
}

// hand decides PV name's call from the caches and makes it. It returns
// the volume's claim when the call failed.
func (a *Agent) hand(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	log := klog.FromContext(ctx)
	pv, err := a.volumes.Get(name)
	if apierrors.IsNotFound(err) {
		a.forget(name)
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var claim *corev1.PersistentVolumeClaim
	if ref := pv.Spec.ClaimRef; ref != nil {
		claim, _ = a.claims.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
	}
	var class *storagev1.VolumeAttributesClass
	if claim != nil && ClassOf(claim) != "" {
		class, _ = a.classes.Get(ClassOf(claim))
	}
	h, why := a.cfg.Scope.Decide(pv, claim, class)
	if why == "" {
		why = a.checkShared(log, pv)
	}
	if why != "" {
		if a.skipped[name] != why && a.cfg.Scope.Mine(pv) {
			log.V(2).Info("Nothing to hand the volume", "pv", name, "why", why)
		}
		a.skipped[name] = why
		delete(a.handed, name)
		return nil, nil
	}
	delete(a.skipped, name)
	err = a.cfg.Modify(ctx, h)
	prev, ok := a.handed[name]
	switch {
	case err != nil && h.Class == "" && status.Code(err) == codes.NotFound:
		// A volume its csi-node does not hold (a static PV's device, a
		// volume being deleted) has no limit to lift.
		if !ok || prev != "" {
			log.V(2).Info("Nothing to lift: csi-node does not hold the volume", "pv", name, "volumeID", h.VolumeID)
		}
		a.handed[name] = ""
		return nil, nil
	case err != nil && h.Class == "":
		return claim, fmt.Errorf("no class (every IO limit lifted) to volume %s: %w", h.VolumeID, err)
	case err != nil:
		return claim, fmt.Errorf("class %q to volume %s: %w", h.Class, h.VolumeID, err)
	}
	a.noteHanded(log, name, h, prev, ok)
	return nil, nil
}

// forget drops what the agent remembers of PV name, which is gone.
func (a *Agent) forget(name string) {
	delete(a.handed, name)
	delete(a.skipped, name)
	delete(a.told, name)
	for key, names := range a.shared {
		if slices.Contains(names, name) {
			delete(a.shared, key)
		}
	}
}

// noteHanded logs a hand of PV name that changed what it was handed
// (prev, when handed before: ok) and remembers it.
func (a *Agent) noteHanded(log klog.Logger, name string, h Hand, prev string, ok bool) {
	switch {
	case ok && prev == h.Class:
	case h.Class != "":
		log.Info("Handed the volume its class", "pv", name, "volumeID", h.VolumeID, "class", h.Class, "parameters", h.Params)
	case ok:
		log.Info("Lifted the volume's IO limits: its claim names no class now", "pv", name, "volumeID", h.VolumeID, "before", prev)
	default:
		// Every volume of no class is handed that at start-up: its
		// first is no news.
		log.V(2).Info("Handed the volume no limit: its claim names no class", "pv", name, "volumeID", h.VolumeID)
	}
	a.handed[name] = h.Class
}
