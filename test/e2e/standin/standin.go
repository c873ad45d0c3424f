package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// standIn is the stand-in for one release: the flags of the release it
// implements, each as the release does (reads), and what it does with
// them until ctx ends.
type standIn struct {
	reads map[string]flagSpec
	run   func(ctx context.Context, a args) error
}

// standIns are the stand-ins by the name of their release's image. Each
// runs as a container of deploy/'s DaemonSet, in an image of its own (the
// e2e suite's standInImage): the test binary itself, started under the
// sidecar's name, as the suite's TestMain dispatches on os.Args[0] (Run).
// Each talks to the API server in-cluster, with the pod's service
// account, so that deploy/'s RBAC is what it gets.
var standIns = map[string]standIn{
	"csi-node-driver-registrar": {reads: registrarFlags, run: runRegistrar},
}

// Is says whether name is the name of a stand-in, which Run runs.
func Is(name string) bool {
	_, ok := standIns[name]
	return ok
}

// Run runs the stand-in called name with argv until SIGTERM and returns
// the process's exit code: 2 for arguments its release refuses, as the
// flag package exits; 1 for those the stand-in does not implement, and
// for an error, which it writes to stderr.
func Run(name string, argv []string) int {
	return run(name, argv, os.Stderr)
}

func run(name string, argv []string, stderr io.Writer) int {
	release, _ := releaseNamed(name)
	s := standIns[name]
	a, err := parseArgs(release, s.reads, argv)
	if err != nil {
		fmt.Fprintf(stderr, "%s %s (stand-in): %v\n", name, release.Version, err)
		if errors.Is(err, errRelease) {
			return 2
		}
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := s.run(ctx, a); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "%s (stand-in): %v\n", name, err)
		return 1
	}
	return 0
}

// releaseNamed is the release whose image is called name.
func releaseNamed(name string) (Release, bool) {
	for _, r := range Releases {
		if filepath.Base(r.Image) == name {
			return r, true
		}
	}
	return Release{}, false
}

// csiFlag is --csi-address, which every stand-in reads, with the default
// of csi-lib-utils' standard flags and of each release that defines it
// itself.
var csiFlag = flagSpec{"/run/csi/socket"}

// csiConn connects to the CSI socket at addr (--csi-address), with or
// without the unix:// its releases accept.
func csiConn(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+strings.TrimPrefix(addr, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// serveHTTP serves handler at path on addr until ctx ends. A port it
// cannot listen on is an error, as it ends each release.
func serveHTTP(ctx context.Context, addr, path string, handler http.HandlerFunc) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc(path, handler)
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	go func() { <-ctx.Done(); srv.Close() }()
	return nil
}
