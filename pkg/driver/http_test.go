package driver

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/httpserve"
)

// TestHTTPFailureFailsTheGroup: an HTTP server that stops by itself sends
// its failure to the group's channel, which stops the plugin (serve), and
// a second failure does not block its server's goroutine once the group
// fails already.
func TestHTTPFailureFailsTheGroup(t *testing.T) {
	failed := make(chan error, 1)
	var servers []httpServer
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := httpserve.NewServer(http.NotFoundHandler(), time.Second)
		t.Cleanup(func() { srv.Close() })
		servers = append(servers, httpServer{srv, lis})
	}
	done := make(chan struct{}, len(servers))
	for _, h := range servers {
		go func() { h.serve(failed); done <- struct{}{} }()
		h.lis.Close()
	}
	for range servers {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a failed server's goroutine did not return within 10 s")
		}
	}
	select {
	case err := <-failed:
		if err == nil {
			t.Error("got a nil failure, want the server's")
		}
	default:
		t.Error("no failure reached the group, want the server's")
	}
}
