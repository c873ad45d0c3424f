package driver

import (
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/converge-csi/converge/pkg/httpserve"
	"github.com/converge-csi/converge/pkg/pool"
)

// TestHTTPFailureFailsTheGroup: an HTTP server that stops by itself sends
// its failure to the group, which serve takes to stop the plugin; the
// group's stop returns, whatever failed and whether serve took a failure,
// and reports a failure serve did not take (one that came as the plugin
// was stopping).
func TestHTTPFailureFailsTheGroup(t *testing.T) {
	tests := []struct {
		name string
		// fail is how many of the two HTTP servers fail; taken, whether
		// serve takes a failure before stopping the group, as it does
		// unless its context ended first.
		fail    int
		taken   bool
		wantErr bool // from stop
	}{
		{name: "none fails", fail: 0, wantErr: false},
		{name: "one fails, taken", fail: 1, taken: true, wantErr: false},
		{name: "one fails as the plugin stops", fail: 1, wantErr: true},
		{name: "both fail, one taken", fail: 2, taken: true, wantErr: true},
		{name: "both fail as the plugin stops", fail: 2, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var https []httpServer
			for range 2 {
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				https = append(https, httpServer{httpserve.NewServer(http.NotFoundHandler(), time.Second), lis})
			}
			lis, err := net.Listen("unix", filepath.Join(dir, "csi.sock"))
			if err != nil {
				t.Fatal(err)
			}
			g := newGroup(grpc.NewServer(), https)
			g.startServers(lis, 4)
			for _, h := range https[:tt.fail] {
				h.lis.Close()
			}
			// The failures sent before the group stops: a server
			// shut down before it sees its listener closed stops
			// cleanly instead.
			deadline := time.Now().Add(10 * time.Second)
			for len(g.failed) < tt.fail {
				if time.Now().After(deadline) {
					t.Fatalf("%d failures reached the group within 10 s, want %d", len(g.failed), tt.fail)
				}
				runtime.Gosched()
			}
			if tt.taken {
				if err := <-g.failed; err == nil {
					t.Fatal("serve took a nil failure, want the server's")
				}
			}
			stopped := make(chan error, 1)
			go func() { stopped <- g.stop(Config{StateDir: dir}, &pool.Pools{}) }()
			select {
			case err := <-stopped:
				if (err != nil) != tt.wantErr {
					t.Errorf("stop: got %v, want a failure: %v", err, tt.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the group's stop did not return within 10 s")
			}
		})
	}
}
