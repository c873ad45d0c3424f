package standin

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/converge-csi/converge/pkg/contract"
)

// TestRegistrar: the registration socket answers the kubelet's GetInfo
// with deploy/'s --kubelet-registration-path as the driver's endpoint;
// /healthz (deploy/'s --http-endpoint) answers as node-driver-registrar
// v2.17.0 does: 200 while its socket answers GetInfo with the driver's
// name, before the kubelet has registered anything, and 404 once the
// socket is gone; the kubelet's refusal ends the registrar, as it ends
// the release.
func TestRegistrar(t *testing.T) {
	release, _ := releaseNamed("csi-node-driver-registrar")
	a, err := parseArgs(release, registrarFlags, deployArgs(t, "node-driver-registrar"))
	if err != nil {
		t.Fatal(err)
	}
	timeout, err := time.ParseDuration(a.string("timeout"))
	if err != nil || timeout < 5*time.Second {
		t.Fatalf("deploy/'s --timeout %q (%v): want 5s or more (the chart test TestProbesBearALoadedNode holds it under the probe's timeoutSeconds)", a.string("timeout"), err)
	}
	r, err := serveRegistration(t.TempDir(), contract.DefaultDriverName, a.string("kubelet-registration-path"), timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)

	conn, err := grpc.NewClient("unix://"+r.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kubelet := registerapi.NewRegistrationClient(conn)
	info, err := kubelet.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if want := "/var/lib/kubelet/plugins/converge.csi.dev/csi.sock"; err != nil || info.Name != contract.DefaultDriverName || info.Endpoint != want {
		t.Errorf("GetInfo: %+v, %v; want %s at %s", info, err, contract.DefaultDriverName, want)
	}

	healthz := func() (int, string) {
		w := httptest.NewRecorder()
		r.healthz(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return w.Code, w.Body.String()
	}
	if code, body := healthz(); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz with the socket serving: %d %q, want 200 ok", code, body)
	}

	if _, err := kubelet.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: false, Error: "no"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.refused:
		if !strings.Contains(err.Error(), "no") {
			t.Errorf("the refusal: %v; want the kubelet's error", err)
		}
	default:
		t.Error("the kubelet's refusal did not end the registrar")
	}

	if err := os.Remove(r.socket); err != nil {
		t.Fatal(err)
	}
	if code, _ := healthz(); code != http.StatusNotFound {
		t.Errorf("/healthz without the socket: %d, want 404", code)
	}
}

// TestRegistrarNeedsKubeletRegistrationPath: without
// --kubelet-registration-path the registrar ends at once, as the release
// does.
func TestRegistrarNeedsKubeletRegistrationPath(t *testing.T) {
	release, _ := releaseNamed("csi-node-driver-registrar")
	a, err := parseArgs(release, registrarFlags, without(deployArgs(t, "node-driver-registrar"), "--kubelet-registration-path"))
	if err != nil {
		t.Fatal(err)
	}
	// Ended already: a registrar that went on would wait for nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := runRegistrar(ctx, a); err == nil || !strings.Contains(err.Error(), "kubelet-registration-path") {
		t.Errorf("got %v, want the flag required", err)
	}
}

// TestRegistrarGivesUpOnTheDriver: a CSI socket that accepts no
// connection ends the registrar once its wait has passed, as
// csi-lib-utils' Connect ends the release after 30 s (exit 1, and the
// kubelet starts the container again); a socket that comes within the
// wait is served.
func TestRegistrarGivesUpOnTheDriver(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	conn, err := csiConn(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if name, err := driverName(ctx, conn, 300*time.Millisecond, time.Second); err == nil || !strings.Contains(err.Error(), "no connection in 300ms") {
		t.Errorf("driverName of a socket nobody serves: %q, %v; want an error after 300ms", name, err)
	}
	if waited := time.Since(start); ctx.Err() != nil {
		t.Errorf("driverName waited %s, past its own wait", waited)
	}

	// The driver comes within the wait.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{})
	go srv.Serve(l)
	defer srv.Stop()
	conn2, err := csiConn(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if name, err := driverName(ctx, conn2, 5*time.Second, time.Second); err != nil || name != contract.DefaultDriverName {
		t.Errorf("driverName of a serving socket: %q, %v; want %s", name, err, contract.DefaultDriverName)
	}
}

// identity answers GetPluginInfo with converge's default name.
type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: contract.DefaultDriverName, VendorVersion: "test"}, nil
}
