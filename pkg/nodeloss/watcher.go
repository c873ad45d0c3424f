package nodeloss

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Config is what the Watcher works with.
type Config struct {
	Client kubernetes.Interface
	// Driver is the CSI driver whose volumes it looks after, TopologyKey
	// the topology segment that pins one to its node.
	Driver, TopologyKey string
	// Grace is how long a node's object must be absent before the node is
	// taken for gone.
	Grace time.Duration
	// Resync is the longest time between two passes.
	Resync  time.Duration
	Events  record.EventRecorder
	Metrics *Metrics
	// Now is the clock (time.Now if nil).
	Now func() time.Time
}

// Watcher runs passes over the driver's volumes: on every change of the
// objects it watches, at the end of a node's grace, and every Resync.
type Watcher struct {
	cfg     Config
	factory informers.SharedInformerFactory
	nodes   corelisters.NodeLister
	volumes corelisters.PersistentVolumeLister
	claims  corelisters.PersistentVolumeClaimLister
	pods    corelisters.PodLister
	sets    appslisters.StatefulSetLister
	classes storagelisters.StorageClassLister
	synced  []cache.InformerSynced
	wake    chan struct{}

	// absent holds, for each node a volume names that does not exist,
	// when a pass first saw it absent.
	absent map[string]time.Time
	// warned holds, for each volume, the last warning its events gave, so
	// that a pass does not repeat it.
	warned map[types.UID]string
}

// New makes a Watcher; Run starts it.
func New(cfg Config) *Watcher {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	f := informers.NewSharedInformerFactory(cfg.Client, 0)
	c := &Watcher{cfg: cfg, factory: f, wake: make(chan struct{}, 1),
		absent: map[string]time.Time{}, warned: map[types.UID]string{}}
	// A pod is kept only for what a pass reads of it: a cluster's pods
	// would otherwise be most of converge-controller's memory.
	if err := f.Core().V1().Pods().Informer().SetTransform(slimPod); err != nil {
		panic(err) // only before the informer starts
	}
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.poke() },
		UpdateFunc: func(any, any) { c.poke() },
		DeleteFunc: func(any) { c.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		f.Core().V1().Nodes().Informer(),
		f.Core().V1().PersistentVolumes().Informer(),
		f.Core().V1().PersistentVolumeClaims().Informer(),
		f.Core().V1().Pods().Informer(),
		f.Apps().V1().StatefulSets().Informer(),
		f.Storage().V1().StorageClasses().Informer(),
	} {
		inf.AddEventHandler(poke)
		c.synced = append(c.synced, inf.HasSynced)
	}
	c.nodes = f.Core().V1().Nodes().Lister()
	c.volumes = f.Core().V1().PersistentVolumes().Lister()
	c.claims = f.Core().V1().PersistentVolumeClaims().Lister()
	c.pods = f.Core().V1().Pods().Lister()
	c.sets = f.Apps().V1().StatefulSets().Lister()
	c.classes = f.Storage().V1().StorageClasses().Lister()
	return c
}

func (c *Watcher) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run watches and passes until ctx ends. It makes no pass before its
// caches hold the whole cluster: a node missing from a cache not yet
// filled is not a node gone.
func (c *Watcher) Run(ctx context.Context) error {
	defer c.factory.Shutdown()
	if err := c.start(ctx); err != nil {
		return err
	}
	log := klog.FromContext(ctx)
	log.Info("Watching the driver's volumes for nodes that are gone", "driver", c.cfg.Driver, "grace", c.cfg.Grace)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-timer.C:
		}
		next := c.cfg.Resync
		d, err := c.Pass(ctx)
		if err != nil {
			log.Error(err, "Pass failed; the next one retries")
		}
		if d.Next > 0 && d.Next < next {
			next = d.Next
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// start starts the informers and waits for their caches to fill.
func (c *Watcher) start(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("the caches did not fill: %w", ctx.Err())
	}
	return nil
}

// Pass reads the caches, decides and acts. It returns the decision, and
// the failure of the first action that failed (the others were tried).
func (c *Watcher) Pass(ctx context.Context) (Decision, error) {
	w, err := c.world()
	if err != nil {
		return Decision{}, err
	}
	d := Decide(w, c.cfg.TopologyKey)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.pass(d)
	}
	log := klog.FromContext(ctx)
	var first error
	// A warning is given once while it says the same; a volume that no
	// longer warns (its node came back) is warned again when it next does.
	warning := map[types.UID]bool{}
	for _, a := range d.Actions {
		if a.Kind.warns() {
			warning[a.Volume.UID] = true
			key := a.Kind.String() + " " + a.Why
			if c.warned[a.Volume.UID] == key {
				continue
			}
			c.warned[a.Volume.UID] = key
		}
		err := act(ctx, c.cfg.Client, c.cfg.Events, a)
		if c.cfg.Metrics != nil {
			c.cfg.Metrics.acted(a.Kind, err)
		}
		kv := []any{"action", a.Kind, "volume", a.Volume.Name, "node", a.Node, "why", a.Why}
		if a.Claim != nil {
			kv = append(kv, "claim", klog.KObj(a.Claim))
		}
		if a.Pod != nil {
			kv = append(kv, "pod", klog.KObj(a.Pod))
		}
		if err != nil {
			log.Error(err, "Acting on a volume whose node is gone failed; the next pass retries", kv...)
			if first == nil {
				first = err
			}
			continue
		}
		log.Info("Acted on a volume whose node is gone", kv...)
	}
	for uid := range c.warned {
		if !warning[uid] {
			delete(c.warned, uid)
			c.sayBack(w, uid)
		}
	}
	return d, first
}

// sayBack tells, on a volume warned of before and on its claim, that its
// node is back: the last word an operator reads there must not be a
// warning that no longer holds. A volume that is gone, or whose node is
// still not there (a warning that changed into an action), gets nothing.
func (c *Watcher) sayBack(w *World, uid types.UID) {
	for _, pv := range w.Volumes {
		if pv.UID != uid {
			continue
		}
		n := nodeOf(pv, c.cfg.TopologyKey)
		if node, ok := w.Nodes[n]; !ok || (outOfService(node) && !ready(node)) {
			return
		}
		msg := "node " + n + " is back: converge releases nothing of this volume, and the warning before no longer holds"
		c.cfg.Events.Event(pv, corev1.EventTypeNormal, ReasonNodeBack, msg)
		if claim := w.claimOf(pv); claim != nil {
			c.cfg.Events.Event(claim, corev1.EventTypeNormal, ReasonNodeBack, msg)
		}
		return
	}
}

// world is the caches' view of the cluster, and the absent nodes' times.
func (c *Watcher) world() (*World, error) {
	w := &World{Now: c.cfg.Now(), Grace: c.cfg.Grace, Nodes: map[string]*corev1.Node{}, AbsentSince: c.absent,
		Claims: map[types.NamespacedName]*corev1.PersistentVolumeClaim{}, Classes: map[string]*storagev1.StorageClass{}}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		w.Nodes[n.Name] = n
	}
	pvs, err := c.volumes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, pv := range pvs {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.Driver {
			continue
		}
		w.Volumes = append(w.Volumes, pv)
		if n := nodeOf(pv, c.cfg.TopologyKey); n != "" {
			named[n] = true
			if _, ok := w.Nodes[n]; !ok && c.absent[n].IsZero() {
				c.absent[n] = w.Now
			}
		}
	}
	for n := range c.absent {
		if _, ok := w.Nodes[n]; ok || !named[n] {
			delete(c.absent, n)
		}
	}
	claims, err := c.claims.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, pvc := range claims {
		w.Claims[types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}] = pvc
	}
	if w.Pods, err = c.pods.List(labels.Everything()); err != nil {
		return nil, err
	}
	if w.Sets, err = c.sets.List(labels.Everything()); err != nil {
		return nil, err
	}
	classes, err := c.classes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, sc := range classes {
		w.Classes[sc.Name] = sc
	}
	return w, nil
}

// slimPod keeps of a pod what a pass reads: its name, UID and deletion,
// its node and the claims it uses.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	slim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp}}
	slim.Spec.NodeName = p.Spec.NodeName
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			slim.Spec.Volumes = append(slim.Spec.Volumes, corev1.Volume{Name: v.Name,
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: v.PersistentVolumeClaim}})
		}
	}
	return slim, nil
}
