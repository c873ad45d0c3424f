package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"time"
)

// A pod's address (cni: a link-local one, its veth's) is reached only from
// its node's network namespace, where the node holds the route to it; the
// test process's own daemons run on the host's 127.0.0.1 (nodenet.go). A
// nodeProxy carries the other way from the nodeLinks: an HTTP proxy
// listening on the host's 127.0.0.1 whose requests it sends on from inside
// one node's namespace, to whatever pod address each request names. A
// Prometheus on the host (prometheus.go) scrapes the node's pods through
// it (its proxy_url), as it would a machine's pods, though the pods come
// and go with addresses of their own. It carries plain http GETs only,
// which is all a scrape is; nothing it carries leaves 127.0.0.0/8 or the
// test's namespaces.

// nodeProxyTimeout bounds a dial into the node's namespace and the wait
// for the response's headers: a pod whose process is stopped (SIGSTOP)
// accepts connections (the kernel does) and never answers; a scrape's own
// timeout is shorter, and ends the request first.
const nodeProxyTimeout = 30 * time.Second

// nodeProxy is an HTTP proxy into a node's network namespace.
type nodeProxy struct {
	addr      string // host:port on the host's loopback
	srv       *http.Server
	transport *http.Transport
}

// proxyInto starts a proxy into the network namespace whose path netns
// returns, asked again at each connection it makes: a node's reboot
// (nodereboot.go) gives it a new one. Its listener takes any free port on
// the host's 127.0.0.1: bound at once, it cannot lose its port to another
// socket before it listens, as a port chosen for a daemon to bind later
// can (freePort).
func proxyInto(netns func() (string, error)) (*nodeProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on the host's loopback for a proxy into a node's network: %w", err)
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ns, err := netns()
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithTimeout(ctx, nodeProxyTimeout)
			defer cancel()
			return dialContextIn(ctx, ns, network, addr)
		},
		ResponseHeaderTimeout: nodeProxyTimeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       time.Minute,
	}
	forward := &httputil.ReverseProxy{
		// The request names its target (absolute form, as a client sends
		// it to a proxy): it goes on as it came.
		Rewrite:   func(*httputil.ProxyRequest) {},
		Transport: transport,
		// A pod that is gone or down is an answer, not a log line.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "proxy into the node's network: "+err.Error(), http.StatusBadGateway)
		},
	}
	p := &nodeProxy{addr: ln.Addr().String(), transport: transport}
	p.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !r.URL.IsAbs() || r.URL.Scheme != "http" {
			http.Error(w, "this proxy carries plain http GETs of absolute URLs only", http.StatusBadRequest)
			return
		}
		forward.ServeHTTP(w, r)
	})}
	go p.srv.Serve(ln)
	return p, nil
}

// url is the proxy's URL, for a client's proxy setting.
func (p *nodeProxy) url() string { return "http://" + p.addr }

// close stops the proxy and ends the requests under way. Closing it again
// is a no-op.
func (p *nodeProxy) close() {
	p.srv.Close()
	p.transport.CloseIdleConnections()
}
