package snaplabel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	authorizationv1 "k8s.io/api/authorization/v1"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Config is what the Labeller works with.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Driver is the CSI driver whose snapshot objects it labels,
	// TopologyKey the topology segment that pins a PV to its node.
	Driver, TopologyKey string
	// Groups says whether the group snapshot API is served: without it
	// only VolumeSnapshotContents are watched.
	Groups bool
	// Resync is the longest time between two passes.
	Resync time.Duration
	Events record.EventRecorder
}

// Labeller labels the driver's snapshot objects on every change of them,
// of the nodes and of the driver's volumes, and every Resync.
type Labeller struct {
	cfg     Config
	kube    informers.SharedInformerFactory
	dyn     dynamicinformer.DynamicSharedInformerFactory
	nodes   corelisters.NodeLister
	volumes corelisters.PersistentVolumeLister
	listers map[schema.GroupVersionResource]cache.GenericLister
	synced  []cache.InformerSynced
	wake    chan struct{}

	// warned holds, for each object, the last event a pass gave it, so
	// that a pass does not repeat it. Only Run's goroutine touches it.
	warned map[types.UID]string
}

// New makes a Labeller; Run starts it.
func New(cfg Config) *Labeller {
	l := &Labeller{cfg: cfg, wake: make(chan struct{}, 1), warned: map[types.UID]string{},
		kube:    informers.NewSharedInformerFactory(cfg.Client, 0),
		dyn:     dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, 0),
		listers: map[schema.GroupVersionResource]cache.GenericLister{}}
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.poke() },
		UpdateFunc: func(any, any) { l.poke() },
		DeleteFunc: func(any) { l.poke() },
	}
	infs := []cache.SharedIndexInformer{l.kube.Core().V1().Nodes().Informer(), l.kube.Core().V1().PersistentVolumes().Informer()}
	gvrs := []schema.GroupVersionResource{ContentsGVR}
	if cfg.Groups {
		gvrs = append(gvrs, GroupContentsGVR, GroupClassesGVR)
	}
	for _, gvr := range gvrs {
		f := l.dyn.ForResource(gvr)
		l.listers[gvr] = f.Lister()
		infs = append(infs, f.Informer())
	}
	for _, inf := range infs {
		inf.AddEventHandler(poke)
		l.synced = append(l.synced, inf.HasSynced)
	}
	l.nodes = l.kube.Core().V1().Nodes().Lister()
	l.volumes = l.kube.Core().V1().PersistentVolumes().Lister()
	return l
}

func (l *Labeller) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run watches and passes until ctx ends. It makes no pass before its
// caches are filled: a node missing from a cache not yet filled is not a
// node gone.
func (l *Labeller) Run(ctx context.Context) error {
	defer l.kube.Shutdown()
	defer l.dyn.Shutdown()
	l.kube.Start(ctx.Done())
	l.dyn.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return fmt.Errorf("the snapshot labeller's caches did not fill: %w", ctx.Err())
	}
	log := klog.FromContext(ctx)
	log.Info("Labelling the driver's snapshot contents for their nodes' csi-snapshotter", "driver", l.cfg.Driver, "groups", l.cfg.Groups)
	ticker := time.NewTicker(l.cfg.Resync)
	defer ticker.Stop()
	for {
		if err := l.Pass(ctx); err != nil {
			log.Error(err, "Snapshot labelling pass failed; the next one retries")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.wake:
		case <-ticker.C:
		}
	}
}

// Pass reads the caches, decides and acts. It returns the first failure
// (the other actions were tried).
func (l *Labeller) Pass(ctx context.Context) error {
	w, err := l.world()
	if err != nil {
		return err
	}
	log := klog.FromContext(ctx)
	var first error
	seen := map[types.UID]bool{}
	for _, a := range Decide(w) {
		uid := a.Object.GetUID()
		seen[uid] = true
		key := a.Reason + " " + a.Message
		if a.Node == "" && l.warned[uid] == key {
			continue
		}
		kv := []any{"resource", a.Resource.Resource, "name", a.Object.GetName(), "reason", a.Reason}
		if a.Node != "" {
			if err := l.label(ctx, a); err != nil {
				log.Error(err, "Labelling failed; the next pass retries", append(kv, "node", a.Node)...)
				if first == nil {
					first = err
				}
				continue
			}
			log.Info("Labelled for its node's csi-snapshotter", append(kv, "node", a.Node)...)
		} else {
			log.Info("Cannot label", append(kv, "message", a.Message)...)
		}
		l.warned[uid] = key
		l.event(a)
	}
	for uid := range l.warned {
		if !seen[uid] {
			delete(l.warned, uid)
		}
	}
	return first
}

// label adds the label with a merge patch of the labels alone, at the
// version the pass saw: a content labelled since (by anyone) is left to the
// next pass, which sees its label and leaves it.
func (l *Labeller) label(ctx context.Context, a Action) error {
	meta := map[string]any{"labels": map[string]string{ManagedByLabel: a.Node}}
	if rv := a.Object.GetResourceVersion(); rv != "" {
		meta["resourceVersion"] = rv
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	_, err = l.cfg.Dynamic.Resource(a.Resource).Patch(ctx, a.Object.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "converge-controller"})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		l.poke()
		return nil
	}
	return err
}

// event records a's event on its object and on its references.
func (l *Labeller) event(a Action) {
	if l.cfg.Events == nil || a.Reason == "" {
		return
	}
	kind := corev1.EventTypeNormal
	if a.Warning {
		kind = corev1.EventTypeWarning
	}
	l.cfg.Events.Event(objectRef(a.Resource, a.Object), kind, a.Reason, a.Message)
	for _, r := range a.Refs {
		l.cfg.Events.Event(r, kind, a.Reason, a.Message)
	}
}

// objectRef references a cluster-scoped snapshot object for an event.
func objectRef(gvr schema.GroupVersionResource, o *unstructured.Unstructured) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: gvr.GroupVersion().String(), Kind: o.GetKind(), Name: o.GetName(),
		UID: o.GetUID(), ResourceVersion: o.GetResourceVersion()}
}

// world reads the caches into one World.
func (l *Labeller) world() (World, error) {
	w := World{Driver: l.cfg.Driver, TopologyKey: l.cfg.TopologyKey, Nodes: map[string]*corev1.Node{}}
	nodes, err := l.nodes.List(labels.Everything())
	if err != nil {
		return w, err
	}
	for _, n := range nodes {
		w.Nodes[n.Name] = n
	}
	pvs, err := l.volumes.List(labels.Everything())
	if err != nil {
		return w, err
	}
	w.Volumes = IndexVolumes(l.cfg.Driver, pvs)
	for gvr, into := range map[schema.GroupVersionResource]*[]*unstructured.Unstructured{
		ContentsGVR: &w.Contents, GroupContentsGVR: &w.GroupContents, GroupClassesGVR: &w.Classes} {
		lister, ok := l.listers[gvr]
		if !ok {
			continue
		}
		objs, err := lister.List(labels.Everything())
		if err != nil {
			return w, err
		}
		*into = unstructuredOf(objs)
	}
	return w, nil
}

func unstructuredOf(objs []runtime.Object) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// Served says which snapshot APIs the server serves at v1: the
// VolumeSnapshotContents, and the group snapshot contents and classes.
func Served(d discovery.DiscoveryInterface) (snapshots, groups bool, err error) {
	has := func(gvr schema.GroupVersionResource) (bool, error) {
		list, err := d.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, r := range list.APIResources {
			if r.Name == gvr.Resource {
				return true, nil
			}
		}
		return false, nil
	}
	if snapshots, err = has(ContentsGVR); err != nil || !snapshots {
		return false, false, err
	}
	a, err := has(GroupContentsGVR)
	if err != nil {
		return snapshots, false, err
	}
	b, err := has(GroupClassesGVR)
	return snapshots, a && b, err
}

// Allowed says whether converge-controller may list and patch the
// resource gvr (a SelfSubjectAccessReview each, which every authenticated
// user may ask): without the snapshots component's RBAC it may not, and a
// Labeller would only log its refused watches.
func Allowed(ctx context.Context, client kubernetes.Interface, gvr schema.GroupVersionResource) (bool, error) {
	for _, verb := range []string{"list", "patch"} {
		r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource, Verb: verb}},
		}, metav1.CreateOptions{})
		if err != nil || !r.Status.Allowed {
			return false, err
		}
	}
	return true, nil
}

// RunWhenServed runs a Labeller while the server serves the snapshot API
// and converge-controller may use it (Allowed), until ctx ends: it asks
// every poll, starts the Labeller when the VolumeSnapshotContents are
// served and allowed (with the group resources if they are), and starts
// it over when that changes (CRDs installed or removed later, the
// snapshots component applied later). A cluster without the snapshot CRDs
// runs no Labeller, and nothing else waits for it.
func RunWhenServed(ctx context.Context, cfg Config, d discovery.DiscoveryInterface, poll time.Duration) {
	log := klog.FromContext(ctx)
	var stop context.CancelFunc
	var done chan struct{}
	running, groups := false, false
	halt := func() {
		if stop != nil {
			stop()
			<-done
			stop = nil
		}
	}
	defer halt()
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	denied := false
	for {
		s, g, err := servedAndAllowed(ctx, cfg, d, &denied)
		switch {
		case err != nil:
			log.Error(err, "Asking the server whether it serves the snapshot API failed; asking again later")
		case s != running || g != groups:
			halt()
			running, groups = s, g
			if !s {
				log.Info("The snapshot API is not served: no snapshot labeller", "group", ContentsGVR.Group)
				break
			}
			c := cfg
			c.Groups = g
			sub, cancel := context.WithCancel(ctx)
			stop = cancel
			done = make(chan struct{})
			go func(l *Labeller, done chan struct{}) {
				defer close(done)
				if err := l.Run(sub); err != nil && !errors.Is(err, context.Canceled) {
					log.Error(err, "The snapshot labeller stopped")
				}
			}(New(c), done)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// servedAndAllowed says whether the server serves the snapshot API (s)
// and its group resources (g), each only where converge-controller may
// use it. denied holds whether the contents were refused at the last ask,
// so that the refusal is logged once, when it starts.
func servedAndAllowed(ctx context.Context, cfg Config, d discovery.DiscoveryInterface, denied *bool) (s, g bool, err error) {
	s, g, err = Served(d)
	if err == nil && s {
		var ok bool
		if ok, err = Allowed(ctx, cfg.Client, ContentsGVR); err == nil && !ok {
			s, g = false, false
			if !*denied {
				klog.FromContext(ctx).Info("converge-controller may not list and patch VolumeSnapshotContents: no snapshot labeller, so pre-provisioned snapshots and group snapshots reach no node. " +
					"Apply deploy/components/snapshots (or set the chart's snapshots.enabled) to grant it")
			}
		}
		*denied = err == nil && !ok
	}
	if err == nil && g {
		var ok bool
		if ok, err = Allowed(ctx, cfg.Client, GroupContentsGVR); err == nil && !ok {
			g = false
		}
	}
	return s, g, err
}
