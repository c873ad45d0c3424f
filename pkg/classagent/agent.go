package classagent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
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
}

// Agent watches the cluster's PersistentVolumes, their claims and the
// VolumeAttributesClasses, and hands each volume of its node the class its
// PV names (Scope.Decide).
type Agent struct {
	cfg     Config
	factory informers.SharedInformerFactory
	synced  []cache.InformerSynced
	volumes corelisters.PersistentVolumeLister
	claims  corelisters.PersistentVolumeClaimLister
	classes storagelisters.VolumeAttributesClassLister
	queue   workqueue.TypedRateLimitingInterface[string]
	// handed is the class each PV was last handed, to log a change once.
	handed map[string]string
}

// New makes an Agent; Run starts it.
func New(cfg Config) *Agent {
	f := informers.NewSharedInformerFactory(cfg.Client, 0)
	a := &Agent{cfg: cfg, factory: f, handed: map[string]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "classagent"})}
	pvs := f.Core().V1().PersistentVolumes().Informer()
	pvs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.addVolume(o) },
		UpdateFunc: func(_, o any) { a.addVolume(o) },
	})
	pvcs := f.Core().V1().PersistentVolumeClaims().Informer()
	pvcs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.addClaim(o) },
		UpdateFunc: func(_, o any) { a.addClaim(o) },
	})
	// A class is made once and never changes its parameters: one that
	// appears may be what a volume waited for.
	vacs := f.Storage().V1().VolumeAttributesClasses().Informer()
	vacs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { a.addAll() }})
	a.synced = []cache.InformerSynced{pvs.HasSynced, pvcs.HasSynced, vacs.HasSynced}
	a.volumes = f.Core().V1().PersistentVolumes().Lister()
	a.claims = f.Core().V1().PersistentVolumeClaims().Lister()
	a.classes = f.Storage().V1().VolumeAttributesClasses().Lister()
	return a
}

func (a *Agent) addVolume(o any) {
	if pv, ok := o.(*corev1.PersistentVolume); ok && a.cfg.Scope.Mine(pv) {
		a.queue.Add(pv.Name)
	}
}

func (a *Agent) addClaim(o any) {
	if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok && pvc.Spec.VolumeName != "" {
		if pv, err := a.volumes.Get(pvc.Spec.VolumeName); err == nil && a.cfg.Scope.Mine(pv) {
			a.queue.Add(pv.Name)
		}
	}
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
	defer a.factory.Shutdown()
	defer a.queue.ShutDown()
	a.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return fmt.Errorf("the caches did not fill: %w", ctx.Err())
	}
	log := klog.FromContext(ctx)
	log.Info("Handing the node's volumes their VolumeAttributesClass", "driver", a.cfg.Scope.Driver, "node", a.cfg.Scope.Node)
	go func() {
		for a.next(ctx) {
		}
	}()
	a.addAll()
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.addAll()
		}
	}
}

// next hands one queued volume; false once the queue is shut down.
func (a *Agent) next(ctx context.Context) bool {
	name, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(name)
	if err := a.hand(ctx, name); err != nil {
		klog.FromContext(ctx).Error(err, "Handing the volume its class failed; retrying", "pv", name, "retries", a.queue.NumRequeues(name))
		a.queue.AddRateLimited(name)
		return true
	}
	a.queue.Forget(name)
	return true
}

// hand decides PV name's call from the caches and makes it.
func (a *Agent) hand(ctx context.Context, name string) error {
	log := klog.FromContext(ctx)
	pv, err := a.volumes.Get(name)
	if apierrors.IsNotFound(err) {
		delete(a.handed, name)
		return nil
	} else if err != nil {
		return err
	}
	var claim *corev1.PersistentVolumeClaim
	if ref := pv.Spec.ClaimRef; ref != nil {
		claim, _ = a.claims.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
	}
	var class *storagev1.VolumeAttributesClass
	if n := deref(pv.Spec.VolumeAttributesClassName); n != "" {
		class, _ = a.classes.Get(n)
	}
	h, why := a.cfg.Scope.Decide(pv, claim, class)
	if why != "" {
		log.V(4).Info("Nothing to hand", "pv", name, "why", why)
		return nil
	}
	if err := a.cfg.Modify(ctx, h); err != nil {
		return fmt.Errorf("class %q to volume %s: %w", h.Class, h.VolumeID, err)
	}
	if a.handed[name] != h.Class {
		log.Info("Handed the volume its class", "pv", name, "volumeID", h.VolumeID, "class", h.Class, "parameters", h.Params)
		a.handed[name] = h.Class
	}
	return nil
}
