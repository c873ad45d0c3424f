package standin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
)

// The stand-ins for the sidecars of deploy/ whose releases the suite cannot
// build (releases.go). Each runs as a container of deploy/'s DaemonSet, in
// an image of its own (the e2e suite's standInImage): the test binary
// itself, started under the sidecar's name, as its TestMain dispatches on
// os.Args[0] (Run). Each
// takes the arguments of the release deploy/ names and refuses any other,
// reads what it needs of them, and talks to the API server in-cluster,
// with the pod's service account, so that deploy/'s RBAC is what it gets.
var standIns = map[string]func(ctx context.Context, args map[string]string) error{
	"csi-node-driver-registrar": runRegistrarStandIn,
	"livenessprobe":             runLivenessStandIn,
	"csi-provisioner":           runProvisionerStandIn,
	"csi-resizer":               runResizerStandIn,
}

// Is says whether name is the name of a stand-in, which Run runs.
func Is(name string) bool {
	_, ok := standIns[name]
	return ok
}

// Run runs the stand-in called name with args until SIGTERM and
// returns the process's exit code: 2 for arguments its release would
// refuse, as the flag package exits.
func Run(name string, args []string) int {
	var release Release
	for _, s := range Releases {
		if filepath.Base(s.Image) == name {
			release = s
		}
	}
	parsed, err := release.parseArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s (stand-in): %v\n", name, release.Version, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := standIns[name](ctx, parsed); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "%s (stand-in): %v\n", name, err)
		return 1
	}
	return 0
}

// parseArgs reads args as --name=value or --name (true) of the release's
// flags. Another form or an unknown name is an error naming it.
func (s Release) parseArgs(args []string) (map[string]string, error) {
	if bad := s.UnknownArgs(args); len(bad) > 0 {
		return nil, fmt.Errorf("flags not defined by %s %s: %v", s.Image, s.Version, bad)
	}
	out := map[string]string{}
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			value = "true"
		}
		out[name] = value
	}
	return out, nil
}

// csiConn connects to the CSI socket of --csi-address.
func csiConn(args map[string]string) (*grpc.ClientConn, error) {
	addr := args["csi-address"]
	if addr == "" {
		return nil, errors.New("--csi-address is required")
	}
	return grpc.NewClient("unix://"+strings.TrimPrefix(addr, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// serveHTTP serves handler on --http-endpoint, if given, until ctx ends.
func serveHTTP(ctx context.Context, args map[string]string, path string, handler http.HandlerFunc) {
	addr := args["http-endpoint"]
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc(path, handler)
	srv := &http.Server{Addr: addr, Handler: mux}
	go srv.ListenAndServe()
	go func() { <-ctx.Done(); srv.Close() }()
}

// runRegistrarStandIn does what node-driver-registrar does: it asks the
// driver's name of the CSI socket, serves the kubelet's registration
// socket in --plugin-registration-path (/registration) with
// --kubelet-registration-path as the endpoint, and answers /healthz on
// --http-endpoint once the kubelet has registered the driver.
func runRegistrarStandIn(ctx context.Context, args map[string]string) error {
	conn, err := csiConn(args)
	if err != nil {
		return err
	}
	defer conn.Close()
	var driver string
	for driver == "" {
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err == nil {
			driver = info.GetName()
		} else if ctx.Err() != nil {
			return err
		} else {
			time.Sleep(time.Second)
		}
	}
	dir := args["plugin-registration-path"]
	if dir == "" {
		dir = "/registration"
	}
	r, err := serveRegistration(dir, driver, args["kubelet-registration-path"])
	if err != nil {
		return err
	}
	defer r.stop()
	serveHTTP(ctx, args, "/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := os.Stat(r.socket); err != nil || r.registered() == 0 {
			http.Error(w, "not registered", http.StatusInternalServerError)
		}
	})
	<-ctx.Done()
	return nil
}

// runLivenessStandIn does what livenessprobe does: /healthz on
// --http-endpoint asks Probe of the CSI socket within --probe-timeout (1s).
func runLivenessStandIn(ctx context.Context, args map[string]string) error {
	conn, err := csiConn(args)
	if err != nil {
		return err
	}
	defer conn.Close()
	timeout := time.Second
	if v := args["probe-timeout"]; v != "" {
		if timeout, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("--probe-timeout: %w", err)
		}
	}
	serveHTTP(ctx, args, "/healthz", func(w http.ResponseWriter, req *http.Request) {
		pctx, cancel := context.WithTimeout(req.Context(), timeout)
		defer cancel()
		resp, err := csi.NewIdentityClient(conn).Probe(pctx, &csi.ProbeRequest{})
		if err != nil || (resp.GetReady() != nil && !resp.GetReady().GetValue()) {
			http.Error(w, fmt.Sprintf("probe: %v %v", resp, err), http.StatusInternalServerError)
		}
	})
	<-ctx.Done()
	return nil
}

// ResizerLease is the Lease external-resizer elects its leader on:
// "external-resizer-" and the driver's name with dots made dashes.
var ResizerLease = "external-resizer-" + strings.ReplaceAll(DriverName, ".", "-")

// standInProvisioner makes the provisioner of provisioner.go for the node
// of NODE_NAME and the CSI socket of --csi-address, its clients from the
// pod's service account.
func standInProvisioner(args map[string]string) (*provisioner, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return newProvisioner(client, dyn, os.Getenv("NODE_NAME"), strings.TrimPrefix(args["csi-address"], "unix://"))
}

// runProvisionerStandIn does what external-provisioner does in deploy/
// (provisioner.go), for the node of NODE_NAME. Only --node-deployment is
// stood in for, and --capacity-ownerref-level 0: the CSIStorageCapacity
// objects are owned by the pod POD_NAME of NAMESPACE, and go with it.
func runProvisionerStandIn(ctx context.Context, args map[string]string) error {
	if args["node-deployment"] != "true" {
		return errors.New("the stand-in provisions only with --node-deployment=true")
	}
	p, err := standInProvisioner(args)
	if err != nil {
		return err
	}
	if args["enable-capacity"] == "true" {
		if level := args["capacity-ownerref-level"]; level != "0" {
			return fmt.Errorf("the stand-in supports --capacity-ownerref-level=0 only, not %q", level)
		}
		pod, err := p.client.CoreV1().Pods(os.Getenv("NAMESPACE")).Get(ctx, os.Getenv("POD_NAME"), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the owner of the capacity objects: %w", err)
		}
		p.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}
	}
	go logErrors(ctx, p)
	p.run(ctx)
	return nil
}

// runResizerStandIn does what external-resizer does (resizer.go): with
// --leader-election, only while it holds the Lease
// ResizerLease of --leader-election-namespace, the
// name external-resizer gives it, which it keeps until it expires when the
// holder stops (ReleaseLeaderElectionOnExit is off by default).
func runResizerStandIn(ctx context.Context, args map[string]string) error {
	p, err := standInProvisioner(args)
	if err != nil {
		return err
	}
	p.provisions = false
	go logErrors(ctx, p)
	if args["leader-election"] != "true" {
		p.lead(true)
		p.run(ctx)
		return nil
	}
	id, _ := os.Hostname()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: ResizerLease, Namespace: args["leader-election-namespace"]},
		Client:     p.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	go p.run(ctx)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 5 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				fmt.Fprintf(os.Stderr, "%s: leading\n", ResizerLeading)
				p.lead(true)
			},
			OnStoppedLeading: func() { p.lead(false) },
		},
	})
	// As csi-lib-utils' leader election does: a lost lease ends the
	// process, and the container starts again as a candidate.
	if ctx.Err() == nil {
		return errors.New("leader election lost")
	}
	return nil
}

// ResizerLeading starts the line the resizer's stand-in logs when it
// takes the Lease.
const ResizerLeading = "acquired lease"

// logErrors prints the stand-in's errors to its container's log.
func logErrors(ctx context.Context, p *provisioner) {
	seen := 0
	for ctx.Err() == nil {
		errs := p.errors()
		for _, e := range errs[min(seen, len(errs)):] {
			fmt.Fprintln(os.Stderr, e)
		}
		seen = len(errs)
		time.Sleep(time.Second)
	}
}
