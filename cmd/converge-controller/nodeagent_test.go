package main

import (
	"context"
	"net"
	"path/filepath"
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

// serveCaps serves s at sock after delay, until t ends.
func serveCaps(t *testing.T, sock string, s capsServer, delay time.Duration) {
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "csi.sock")
			serveCaps(t, sock, capsServer{caps: tc.caps}, 500*time.Millisecond)
			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got, err := modifyAdvertised(ctx, csi.NewControllerClient(conn))
			if err != nil || got != tc.want {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
