package driver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestHTTPServerBounds: the HTTP address's server refuses headers larger
// than httpMaxHeader and closes a kept-alive connection left idle, which a
// peer on the pod network could otherwise hold open without end.
func TestHTTPServerBounds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := newHTTPServer(ok, time.Second, 200*time.Millisecond)
	go srv.Serve(lis)
	defer srv.Close()
	url := "http://" + lis.Addr().String() + "/"

	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Large", strings.Repeat("a", 2*httpMaxHeader))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: got %s, want 431", 2*httpMaxHeader, resp.Status)
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
