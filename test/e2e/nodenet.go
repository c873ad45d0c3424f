package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Each node's daemons run in a network namespace of the node's own
// (nodens.go), as on a machine of its own, and the control plane on the
// host's 127.0.0.1. What crosses between them is carried by nodeLinks, in
// the test process, over loopback on both sides: no packet leaves
// 127.0.0.0/8 or the test's own namespaces.
//   - The kubelet's API server, https://127.0.0.1:<port> in its
//     kubeconfig, is a listener on the node's 127.0.0.1 at that port.
//   - The kubernetes Service, whose ClusterIP (the first address of
//     --service-cluster-ip-range) and port 443 the kubelet gives every
//     container as KUBERNETES_SERVICE_HOST and _PORT, is a listener on that
//     address, which the node holds; the pods reach it by their default
//     route to the node (./cni). On a real cluster kube-proxy routes the
//     ClusterIP to the API server's endpoints; here one Service, no NAT, a
//     copy in user space. TLS, service account tokens and RBAC are the API
//     server's own, end to end (the API server's certificate names the
//     ClusterIP).
//   - The kubelet's own port, which the API server dials at the node's
//     host name (127.0.0.1) for logs, exec and port-forward, is a listener
//     on the host's 127.0.0.1 at the same port.
const (
	kubernetesServiceIP   = "10.96.0.1"
	kubernetesServicePort = 443
	// nodeAddressFormat makes each node's own address in its namespace
	// (the first node's 10.97.0.1): its InternalIP, and the source of what
	// it sends its pods. The kubelet refuses a loopback or link-local one.
	nodeAddressFormat = "10.97.0.%d"
)

// nodeLinks are the listeners that join a node's network namespace to the
// control plane.
type nodeLinks struct {
	mu        sync.Mutex // guards listeners
	listeners []net.Listener
}

// link starts the listeners of a node whose network namespace is netns
// (a path), its kubelet on kubeletPort, for the API server at apiserver
// (host:port on the host's loopback).
func link(netns string, kubeletPort int, apiserver string) (*nodeLinks, error) {
	l := &nodeLinks{}
	toAPIServer := func() (net.Conn, error) { return net.Dial("tcp", apiserver) }
	_, apiPort, _ := net.SplitHostPort(apiserver)
	for _, addr := range []string{"127.0.0.1:" + apiPort, fmt.Sprintf("%s:%d", kubernetesServiceIP, kubernetesServicePort)} {
		ln, err := listenIn(netns, addr)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("listening on %s in the node's network: %w", addr, err)
		}
		l.serve(ln, toAPIServer)
	}
	kubelet := fmt.Sprintf("127.0.0.1:%d", kubeletPort)
	ln, err := net.Listen("tcp", kubelet)
	if err != nil {
		l.close()
		return nil, fmt.Errorf("listening on the host's %s for the kubelet: %w", kubelet, err)
	}
	l.serve(ln, func() (net.Conn, error) { return dialIn(netns, kubelet) })
	return l, nil
}

func (l *nodeLinks) serve(ln net.Listener, dial func() (net.Conn, error)) {
	l.mu.Lock()
	l.listeners = append(l.listeners, ln)
	l.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go carry(c, dial)
		}
	}()
}

// close closes every listener; connections under way end with their
// peers.
func (l *nodeLinks) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.listeners {
		ln.Close()
	}
	l.listeners = nil
}

// carry copies between c and a connection dial makes, both ways, until
// both sides are done.
func carry(c net.Conn, dial func() (net.Conn, error)) {
	defer c.Close()
	up, err := dial()
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// listenIn opens a TCP listener on addr in the network namespace at netns.
func listenIn(netns, addr string) (ln net.Listener, err error) {
	err = inNetns(netns, func() error {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// dialIn connects to addr over TCP from the network namespace at netns.
func dialIn(netns, addr string) (net.Conn, error) {
	return dialContextIn(context.Background(), netns, "tcp", addr)
}

// dialContextIn connects to addr over network from the network namespace
// at netns, until ctx ends. addr's host is an IP address: the resolution
// of a name, and the second family's attempt of a name that has both,
// would run on other threads, outside the namespace.
func dialContextIn(ctx context.Context, netns, network, addr string) (c net.Conn, err error) {
	err = inNetns(netns, func() error {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// inNetns runs fn on the calling goroutine's OS thread, moved into the
// network namespace at netns and back; a socket fn makes stays in that
// namespace. The thread outlives the call: a thread that ends sends the
// Pdeathsig of every process it started (the node's init, the daemons,
// proc.go) to them, so a goroutine that locks a thread must never end with
// it. Only when the thread cannot go back does it stay locked to the
// goroutine, in the wrong namespace, and the error says so.
func inNetns(netns string, fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(netns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering the network namespace %s: %w", netns, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leaving the network namespace %s (the thread stays in it): %w", netns, err)
	}
	runtime.UnlockOSThread()
	return fnErr
}
