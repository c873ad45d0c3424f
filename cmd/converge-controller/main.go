// Command converge-controller is converge's cluster-side controller: the
// only converge component that talks to the API server. It runs as a small
// Deployment; its replicas elect a leader on a Lease, and the leader runs
// nodeloss.Watcher, which looks after the driver's volumes whose node is
// gone (pkg/nodeloss), and, where the snapshot API is served, the snapshot
// labeller, which routes the driver's snapshot contents to their node's
// csi-snapshotter (pkg/snaplabel). It is not the node-local CSI Controller service
// (pkg/controller), which every csi-node serves.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/buildinfo"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/httpserve"
	"github.com/converge-csi/converge/pkg/nodeloss"
	"github.com/converge-csi/converge/pkg/snaplabel"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

const (
	// leaseName is the Lease the replicas elect their leader on.
	leaseName = "converge-controller"
	// defaultDeletedNodeGrace is how long a deleted Node stays absent
	// before its volumes are taken for lost. A Node is deleted for real by
	// a cloud's node lifecycle controller when its instance is gone, and
	// by mistake with kubectl delete node; a running kubelet does not
	// register its Node again (only a kubelet that starts does), so a live
	// node deleted by mistake stays deleted until someone restarts its
	// kubelet. Its pods are deleted by the pod GC within a minute either
	// way; what the grace decides is when a release, which cannot be
	// undone, happens: ten minutes leave an operator the time to read the
	// NodeLossPending event and restart the kubelet, and delay a
	// StatefulSet's replica on a dead node by as much. An operator who
	// knows the node is dead says so at once with the out-of-service taint.
	defaultDeletedNodeGrace = 10 * time.Minute
)

type options struct {
	kubeconfig, driverName, namespace, identity, httpAddress string
	grace, resync                                            time.Duration
	leaseDuration, renewDeadline, retryPeriod                time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeAgentCommand {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := nodeAgent(ctx, os.Args[2:]); err != nil {
			klog.ErrorS(err, "converge node agent failed")
			klog.Flush()
			os.Exit(1)
		}
		klog.Flush()
		return
	}
	host, _ := os.Hostname()
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "kube-system"
	}
	var o options
	fs := flag.CommandLine
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: the pod's service account)")
	fs.StringVar(&o.driverName, "driver-name", contract.DefaultDriverName, "CSI driver whose volumes to look after")
	fs.StringVar(&o.namespace, "leader-election-namespace", ns, "namespace of the Lease the replicas elect their leader on (default $POD_NAMESPACE, else kube-system)")
	fs.StringVar(&o.identity, "identity", host, "this replica's name in the Lease")
	fs.StringVar(&o.httpAddress, "http-address", ":9812", "host:port serving /metrics and /healthz (empty: none)")
	fs.DurationVar(&o.grace, "deleted-node-grace", defaultDeletedNodeGrace, "how long a node's object must be absent before its volumes are taken for lost (a running kubelet does not register its deleted Node again: only a restarted one does); a node with the node.kubernetes.io/out-of-service taint is lost as soon as it is not Ready")
	fs.DurationVar(&o.resync, "resync-period", 5*time.Minute, "longest time between two passes over the volumes")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long the other replicas wait before they take a Lease that is not renewed")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew its Lease before it stops")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second, "how often the replicas try to take or renew the Lease")
	showVersion := fs.Bool("version", false, "print the version and exit")
	klog.InitFlags(fs)
	flag.Parse()
	if *showVersion {
		fmt.Println(buildinfo.Version(version))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "converge-controller failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// run elects and, while this replica leads, runs the node-loss watcher, until ctx
// ends. A replica that loses the lead returns an error, so that it starts
// over with nothing of its term (its pod restarts).
func run(ctx context.Context, o options) error {
	if o.grace < 0 || o.resync <= 0 {
		return fmt.Errorf("--deleted-node-grace must not be negative and --resync-period must be positive")
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "converge-controller/" + buildinfo.Version(version)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := nodeloss.NewMetrics(reg)
	health := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	// A failure of the HTTP server ends the run: a replica whose
	// /healthz is gone would be restarted by its liveness probe anyway,
	// later and with a less clear reason.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	if o.httpAddress != "" {
		ln, err := net.Listen("tcp", o.httpAddress)
		if err != nil {
			return err
		}
		serve(ctx, ln, reg, map[string]func(*http.Request) error{"/healthz": health.Check}, fail)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	events := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "converge-controller"})

	err = lead(ctx, o, client, health, metrics, func(ctx context.Context) {
		// The labeller has caches of its own: a cluster without the
		// snapshot CRDs, or without the snapshots component's RBAC, must
		// not hold the node-loss watcher up.
		labelled := make(chan struct{})
		go func() {
			defer close(labelled)
			snaplabel.RunWhenServed(ctx, snaplabel.Config{Client: client, Dynamic: dyn, Driver: o.driverName,
				TopologyKey: contract.TopologyKey, Resync: o.resync, Events: events}, client.Discovery(), time.Minute)
		}()
		defer func() { <-labelled }()
		w := nodeloss.New(nodeloss.Config{Client: client, Driver: o.driverName, TopologyKey: contract.TopologyKey,
			Grace: o.grace, Resync: o.resync, Events: events, Metrics: metrics})
		if err := w.Run(ctx); err != nil {
			klog.ErrorS(err, "The node-loss watcher stopped")
		}
	})
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// lead takes part in the election on the Lease until ctx ends, and runs
// work while this replica leads (work must return when its context ends:
// the lead is lost, or ctx ended). It returns an error when the lead was
// lost before ctx ended, nil otherwise; the leader's gauge and health
// follow the lead.
func lead(ctx context.Context, o options, client kubernetes.Interface, health *leaderelection.HealthzAdaptor, metrics *nodeloss.Metrics, work func(context.Context)) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: leaseName, Namespace: o.namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.identity},
	}
	var lost error
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod,
		ReleaseOnCancel: true, WatchDog: health, Name: leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				metrics.Leader.Set(1)
				klog.InfoS("Leading", "lease", klog.KRef(o.namespace, leaseName), "identity", o.identity)
				work(ctx)
			},
			OnStoppedLeading: func() {
				metrics.Leader.Set(0)
				if ctx.Err() == nil {
					lost = errors.New("lost the lead; starting over")
				}
			},
			OnNewLeader: func(id string) {
				if id != o.identity {
					klog.InfoS("Another replica leads", "lease", klog.KRef(o.namespace, leaseName), "leader", id)
				}
			},
		},
	})
	return lost
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// serve serves /metrics of reg and, at each path of checks, its check
// (ok, or 500 and why not) on ln until ctx ends, bounded as every
// converge address on the pod network is (httpserve); a server that stops
// by itself calls fail. converge-controller's /healthz fails when this
// replica leads but has not renewed its Lease in time.
func serve(ctx context.Context, ln net.Listener, reg *prometheus.Registry, checks map[string]func(*http.Request) error, fail context.CancelCauseFunc) {
	mux := http.NewServeMux()
	// Scrapes at once share one gathering.
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{CoalesceGather: true}))
	for path, check := range checks {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if err := check(r); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
	}
	srv := httpserve.NewServer(mux, httpserve.WriteTimeout)
	go func() {
		if err := httpserve.Serve(srv, ln); err != nil {
			fail(err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
}
