package driver

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// TestProbeSelf checks that the liveness check fails when nothing answers
// on the socket, and is then satisfied, at once, by a Probe that answers
// not ready (a long start-up is alive).
func TestProbeSelf(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	live := probeSelf(sock)
	if err := live(context.Background()); err == nil {
		t.Errorf("nothing serves %s: got live, want an error", sock)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identity{name: "test", ready: func() bool { return false }})
	go srv.Serve(lis)
	defer srv.Stop()
	if err := live(context.Background()); err != nil {
		t.Errorf("Probe answers not ready: got %v, want live", err)
	}
}
