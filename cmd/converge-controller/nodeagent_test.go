package main

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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

// switchServer advertises MODIFY_VOLUME while on is true.
type switchServer struct {
	csi.UnimplementedControllerServer
	on atomic.Bool
}

func (s *switchServer) ControllerGetCapabilities(ctx context.Context, r *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
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
			got, err := modifyAdvertised(ctx, dialCSI(t, sock))
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
	go func() { done <- untilWithdrawn(ctx, ctrl, 10*time.Millisecond) }()
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
	if got := untilWithdrawn(stopped, ctrl, time.Hour); got {
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
