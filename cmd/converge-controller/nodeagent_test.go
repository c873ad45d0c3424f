package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// capsServer answers ControllerGetCapabilities with caps.
type capsServer struct {
	csi.UnimplementedControllerServer
	caps []csi.ControllerServiceCapability_RPC_Type
}

func (s capsServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var out []*csi.ControllerServiceCapability
	for _, c := range s.caps {
		out = append(out, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: out}, nil
}

// switchServer advertises MODIFY_VOLUME while on is true, and answers
// UNAVAILABLE while down is.
type switchServer struct {
	csi.UnimplementedControllerServer
	on, down atomic.Bool
}

func (s *switchServer) ControllerGetCapabilities(ctx context.Context, r *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	if s.down.Load() {
		return nil, status.Error(codes.Unavailable, "csi-node is down")
	}
	var caps capsServer
	if s.on.Load() {
		caps.caps = []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_MODIFY_VOLUME}
	}
	return caps.ControllerGetCapabilities(ctx, r)
}

// serveCaps serves s at sock after delay, until t ends.
func serveCaps(t *testing.T, sock string, s csi.ControllerServer, delay time.Duration) {
	srv := grpc.NewServer()
	csi.RegisterControllerServer(srv, s)
	t.Cleanup(srv.Stop)
	go func() {
		time.Sleep(delay)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		srv.Serve(ln)
	}()
}

// TestModifyAdvertised: the agent waits for a csi-node that is not up yet,
// and hands classes only to one that advertises MODIFY_VOLUME.
func TestModifyAdvertised(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps []csi.ControllerServiceCapability_RPC_Type
		want bool
	}{
		{"advertised", []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME}, true},
		{"not advertised", []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}, false},
		// A csi-node without a controller service answers UNIMPLEMENTED.
		{"unimplemented", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "csi.sock")
			var srv csi.ControllerServer = capsServer{caps: tc.caps}
			if tc.caps == nil {
				srv = csi.UnimplementedControllerServer{}
			}
			serveCaps(t, sock, srv, 500*time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got, err := modifyAdvertised(ctx, dialCSI(t, sock), newReadiness(sock))
			if err != nil || got != tc.want {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestUntilWithdrawn: the agent, in a pod of its own, notices that
// csi-node stopped advertising MODIFY_VOLUME (its gate turned off, which
// restarts csi-node alone), and stops at once when its context ends.
func TestUntilWithdrawn(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	srv := &switchServer{}
	srv.on.Store(true)
	serveCaps(t, sock, srv, 0)
	ctrl := dialCSI(t, sock)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan bool, 1)
	go func() { done <- untilWithdrawn(ctx, ctrl, 10*time.Millisecond, newReadiness(sock)) }()
	select {
	case got := <-done:
		t.Fatalf("got %v while csi-node advertises MODIFY_VOLUME, want it to keep asking", got)
	case <-time.After(200 * time.Millisecond):
	}
	srv.on.Store(false)
	if got := <-done; !got {
		t.Errorf("got %v once csi-node stopped advertising MODIFY_VOLUME, want true", got)
	}

	stopped, stop := context.WithCancel(context.Background())
	stop()
	if got := untilWithdrawn(stopped, ctrl, time.Hour, newReadiness(sock)); got {
		t.Errorf("got %v with its context ended, want false", got)
	}
}

// dialCSI is a controller client of the socket sock, closed when t ends.
func dialCSI(t *testing.T, sock string) csi.ControllerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn)
}

// eventually waits until ready's check agrees with want: "" for ready,
// else a part of the reason it is not.
func eventually(t *testing.T, when string, ready *readiness, want string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		err = ready.check(nil)
		if (want == "" && err == nil) || (want != "" && err != nil && strings.Contains(err.Error(), want)) {
			return
		}
	}
	if want == "" {
		t.Fatalf("%s: not ready after 10 s: %v", when, err)
	}
	t.Fatalf("%s: got %v after 10 s, want not ready: %s", when, err, want)
}

// TestClassLoopReadiness: the agent is not ready while csi-node does not
// answer, nor while its caches fill; ready once it hands, or once
// csi-node answers that it does not serve ControllerModifyVolume (idle,
// rightly); and not ready again when csi-node stops answering while it
// hands.
func TestClassLoopReadiness(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	srv := &switchServer{}
	srv.down.Store(true)
	serveCaps(t, sock, srv, 0)
	ready := newReadiness(sock)
	release := make(chan struct{})
	var runs, running atomic.Int32
	loop := classLoop{ctrl: dialCSI(t, sock), csiAddress: sock, ready: ready, recheck: 10 * time.Millisecond,
		run: func(ctx context.Context, synced func()) error {
			runs.Add(1)
			running.Add(1)
			defer running.Add(-1)
			select {
			case <-release:
				synced()
			case <-ctx.Done():
				return nil
			}
			<-ctx.Done()
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.loop(ctx) }()

	eventually(t, "csi-node down", ready, "csi-node is down")
	srv.down.Store(false)
	eventually(t, "csi-node without MODIFY_VOLUME", ready, "")
	if n := runs.Load(); n != 0 {
		t.Errorf("%d agents run while csi-node does not advertise MODIFY_VOLUME, want none", n)
	}

	srv.on.Store(true)
	eventually(t, "caches filling", ready, "caches")
	time.Sleep(50 * time.Millisecond)
	eventually(t, "caches still filling", ready, "caches")
	close(release)
	eventually(t, "handing", ready, "")

	srv.down.Store(true)
	eventually(t, "csi-node down while the agent hands", ready, "csi-node is down")
	srv.down.Store(false)
	eventually(t, "csi-node back", ready, "")

	srv.on.Store(false)
	for deadline := time.Now().Add(10 * time.Second); running.Load() != 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if running.Load() != 0 {
		t.Fatal("the agent still runs 10 s after csi-node withdrew MODIFY_VOLUME")
	}
	eventually(t, "MODIFY_VOLUME withdrawn", ready, "")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("loop: %v", err)
	}
}

// TestNodeAgentProbes: /healthz answers while the agent serves, /readyz
// only once it is ready, saying why not before.
func TestNodeAgentProbes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, fail := context.WithCancelCause(context.Background())
	defer fail(nil)
	ready := newReadiness("/csi/csi.sock")
	serve(ctx, ln, prometheus.NewRegistry(), ready.checks(), fail)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code == http.StatusOK || !strings.Contains(body, "/csi/csi.sock has not answered") {
		t.Errorf("/readyz before csi-node answered: got %d %q, want a failure saying why", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: got %d, want 200", code)
	}
	ready.asked(nil)
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once csi-node answered: got %d, want 200", code)
	}
}
