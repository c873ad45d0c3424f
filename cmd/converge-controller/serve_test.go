package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/converge-csi/converge/pkg/httpserve"
)

// TestServeIsBoundedAndFailsTheRun: the replica's /metrics and /healthz
// server refuses headers past httpserve's bound, as csi-node's does (a
// peer on the pod network must not fill the replica's memory), and a
// server that stops by itself ends the run with its failure.
func TestServeIsBoundedAndFailsTheRun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, fail := context.WithCancelCause(context.Background())
	defer fail(nil)
	serve(ctx, ln, prometheus.NewRegistry(), map[string]func(*http.Request) error{"/healthz": leaderelection.NewLeaderHealthzAdaptor(time.Second).Check}, fail)

	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/healthz", nil)
	req.Header.Set("X-Large", strings.Repeat("a", 2*httpserve.MaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: got %s, want 431", 2*httpserve.MaxHeaderBytes, resp.Status)
	}

	ln.Close()
	select {
	case <-ctx.Done():
		if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), ln.Addr().String()) {
			t.Errorf("the run's cause: got %v, want the server's failure naming %s", cause, ln.Addr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end within 10 s of its server's failure")
	}
}
