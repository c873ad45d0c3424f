package standin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrarFlags are the flags of node-driver-registrar v2.17.0
// (cmd/csi-node-driver-registrar) its stand-in implements, with the
// release's defaults.
var registrarFlags = map[string]flagSpec{
	"csi-address": csiFlag,
	// Required: the release exits without it.
	"kubelet-registration-path": {""},
	// Empty: no HTTP server (--health-port, deprecated, is 0).
	"http-endpoint": {""},
	// How long it waits for GetPluginInfo of the driver, and for GetInfo
	// of its own socket in /healthz.
	"timeout": {"1s"},
}

const (
	// registrarDir is the release's --plugin-registration-path: the
	// kubelet's plugin registration directory as the container sees it.
	registrarDir = "/registration"
	// registrarConnect is how long the release waits for the CSI socket
	// to accept a connection (csi-lib-utils' Connect, which gives up after
	// 30 s) before it exits 1, for its container to start again.
	registrarConnect = 30 * time.Second
)

// registrar speaks the kubelet's plugin-registration protocol for csi-node,
// as node-driver-registrar does: it serves <dir>/<driver>-reg.sock, which
// the kubelet's plugin watcher finds, asks GetInfo of, and answers with
// NotifyRegistrationStatus. Removing the socket deregisters the driver.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint, socket string
	// timeout is --timeout: /healthz's wait for GetInfo.
	timeout time.Duration
	srv     *grpc.Server
	// refused receives the kubelet's error when it refuses the driver
	// (capacity 1: the release ends at the first).
	refused chan error
}

// serveRegistration serves <dir>/<driver>-reg.sock, the kubelet's plugin
// registration directory as the registrar sees it, with endpoint
// (--kubelet-registration-path) as the driver's socket. A socket left
// there by a previous registrar is replaced.
func serveRegistration(dir, driver, endpoint string, timeout time.Duration) (*registrar, error) {
	r := &registrar{timeout: timeout,
		driver:   driver,
		endpoint: endpoint,
		socket:   filepath.Join(dir, driver+"-reg.sock"),
		refused:  make(chan error, 1),
	}
	if err := os.Remove(r.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", r.socket)
	if err != nil {
		return nil, err
	}
	r.srv = grpc.NewServer()
	registerapi.RegisterRegistrationServer(r.srv, r)
	go r.srv.Serve(l)
	return r, nil
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		select {
		case r.refused <- fmt.Errorf("the kubelet refused the driver: %s", s.Error):
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// healthz answers as the release's /healthz: 404 while the registration
// socket is missing, 200 when GetInfo through it names the driver within
// its --timeout, 500 otherwise. Whether the kubelet has registered the
// driver does not count.
func (r *registrar) healthz(w http.ResponseWriter, req *http.Request) {
	if _, err := os.Stat(r.socket); errors.Is(err, os.ErrNotExist) {
		http.Error(w, "registration socket does not exist", http.StatusNotFound)
		return
	}
	conn, err := grpc.NewClient("unix://"+r.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(req.Context(), r.timeout)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	switch {
	case err != nil:
		http.Error(w, fmt.Sprintf("error getting info from node-registrar socket: %v", err), http.StatusInternalServerError)
	case info.GetName() != r.driver:
		http.Error(w, "invalid driver name "+info.GetName(), http.StatusInternalServerError)
	default:
		fmt.Fprint(w, "ok")
	}
}

// stop stops serving and removes the socket: the kubelet deregisters.
func (r *registrar) stop() {
	r.srv.Stop()
	os.Remove(r.socket)
}

// driverName waits up to connect for the CSI socket to accept a
// connection, as csi-lib-utils' Connect does, then asks the driver's name
// within timeout.
func driverName(ctx context.Context, conn *grpc.ClientConn, connect, timeout time.Duration) (string, error) {
	wait, cancel := context.WithTimeout(ctx, connect)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(wait, s) {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", fmt.Errorf("error connecting to CSI driver: no connection in %s (last state %s)", connect, s)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return "", fmt.Errorf("GetPluginInfo: %w", err)
	}
	return info.GetName(), nil
}

// runRegistrar does what node-driver-registrar does: it asks the driver's
// name of the CSI socket (and ends with an error when the socket accepts
// no connection within registrarConnect), serves the kubelet's registration socket in
// registrarDir with --kubelet-registration-path as the endpoint, and
// /healthz on --http-endpoint, if given. It ends with an error when the
// kubelet refuses the driver, for the container to start again and
// register anew, as the release exits.
func runRegistrar(ctx context.Context, a args) error {
	endpoint := a.string("kubelet-registration-path")
	if endpoint == "" {
		return errors.New("kubelet-registration-path is a required parameter")
	}
	conn, err := csiConn(a.string("csi-address"))
	if err != nil {
		return err
	}
	timeout, err := time.ParseDuration(a.string("timeout"))
	if err != nil {
		conn.Close()
		return fmt.Errorf("--timeout: %w", err)
	}
	driver, err := driverName(ctx, conn, registrarConnect, timeout)
	conn.Close()
	if err != nil {
		return err
	}
	r, err := serveRegistration(registrarDir, driver, endpoint, timeout)
	if err != nil {
		return err
	}
	defer r.stop()
	if addr := a.string("http-endpoint"); addr != "" {
		if err := serveHTTP(ctx, addr, "/healthz", r.healthz); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-r.refused:
		return err
	}
}
