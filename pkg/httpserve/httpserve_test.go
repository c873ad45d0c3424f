package httpserve

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestServerBounds: the server refuses headers larger than MaxHeaderBytes
// and closes a kept-alive connection left idle, which a peer on the pod
// network could otherwise hold open without end.
func TestServerBounds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := NewServer(ok, time.Second)
	for name, got := range map[string]time.Duration{"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout, "IdleTimeout": srv.IdleTimeout} {
		if got <= 0 {
			t.Errorf("%s: got %v, want a bound", name, got)
		}
	}
	// The idle bound shortened, so that the test need not wait a minute.
	srv.IdleTimeout = 200 * time.Millisecond
	go srv.Serve(lis)
	defer srv.Close()
	url := "http://" + lis.Addr().String() + "/"

	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Large", strings.Repeat("a", 2*MaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: got %s, want 431", 2*MaxHeaderBytes, resp.Status)
	}

	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: test\r\n\r\n")
	r := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(r, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a first request: %v, %v", resp, err)
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := r.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection idle for 3 s is still open, want it closed after 200 ms")
	} else if err != io.EOF {
		t.Errorf("a connection left idle: got %v, want it closed (EOF)", err)
	}
}

// TestServeReportsAFailure: a server whose listener closes under it is a
// failure, naming its address, for the process to stop on; one shut down
// is not.
func TestServeReportsAFailure(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	tests := []struct {
		name    string
		end     func(srv *http.Server, lis net.Listener)
		wantErr bool
	}{
		{"listener closed", func(_ *http.Server, lis net.Listener) { lis.Close() }, true},
		{"shut down", func(srv *http.Server, _ net.Listener) { srv.Shutdown(context.Background()) }, false},
		{"closed", func(srv *http.Server, _ net.Listener) { srv.Close() }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := lis.Addr().String()
			srv := NewServer(ok, time.Second)
			defer srv.Close()
			done := make(chan error, 1)
			go func() { done <- Serve(srv, lis) }()
			// Serving: a request is answered before the end comes.
			resp, err := http.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			tt.end(srv, lis)
			select {
			case err := <-done:
				if (err != nil) != tt.wantErr {
					t.Fatalf("got %v, want an error: %v", err, tt.wantErr)
				}
				if err != nil && !strings.Contains(err.Error(), addr) {
					t.Errorf("got %q, want it to name %s", err, addr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return within 10 s of its end")
			}
		})
	}
}

// failingOnce is a listener whose first Accept fails with errno.
type failingOnce struct {
	net.Listener
	errno  syscall.Errno
	failed atomic.Bool
}

func (l *failingOnce) Accept() (net.Conn, error) {
	if !l.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", l.errno)}
	}
	return l.Listener.Accept()
}

// TestServeRetriesAcceptErrors: an accept error that Go does not deem
// temporary, such as a new connection's pending network error which
// Linux's accept(2) passes on (EPROTO, which a peer can cause), is
// retried, and the server goes on serving rather than ending, which would
// stop its process; one that says the listening socket itself is broken
// ends it.
func TestServeRetriesAcceptErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errno syscall.Errno
		ends  bool
	}{
		{"a connection's network error", syscall.EPROTO, false},
		{"an unreachable peer", syscall.EHOSTUNREACH, false},
		{"the socket broken", syscall.EBADF, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }), time.Second)
			srv.ErrorLog = log.New(io.Discard, "", 0)
			done := make(chan error, 1)
			go func() { done <- Serve(srv, &failingOnce{Listener: lis, errno: tc.errno}) }()
			if tc.ends {
				select {
				case err := <-done:
					if !errors.Is(err, tc.errno) {
						t.Errorf("Serve: got %v, want it ended by %v", err, tc.errno)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("Serve still runs 10 s after its socket broke")
				}
				return
			}
			client := &http.Client{Timeout: 10 * time.Second}
			resp, err := client.Get("http://" + lis.Addr().String() + "/")
			if err != nil {
				t.Fatalf("a request after an accept error: %v, want it answered", err)
			}
			resp.Body.Close()
			srv.Close()
			if err := <-done; err != nil {
				t.Errorf("Serve after a close: got %v, want nil", err)
			}
		})
	}
}
