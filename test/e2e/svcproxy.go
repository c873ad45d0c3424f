package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The cluster's one Service that pods use, the API server's "kubernetes"
// in "default": its ClusterIP is the first of --service-cluster-ip-range,
// port 443, and the kubelet gives every container KUBERNETES_SERVICE_HOST
// and _PORT for it, from which in-cluster clients (the sidecars of deploy/)
// take the API server's address. On a real cluster kube-proxy makes the
// ClusterIP reach the API server's endpoints. Here the API server listens
// on 127.0.0.1 only and no packet may leave loopback or the test's own
// network namespaces, so the pod network (./cni) puts the ClusterIP on
// each pod's own interface, and serviceProxy listens on it inside the
// pod's network namespace and carries each connection to the API server on
// the host's 127.0.0.1: TLS, the service account token and RBAC are the
// API server's own, end to end.
const (
	kubernetesServiceIP   = "10.96.0.1"
	kubernetesServicePort = 443
)

// serviceProxy serves the pod network's requests on a unix socket: "add
// <id>" with the pod's network namespace as the message's descriptor
// opens a listener on kubernetesServiceIP:kubernetesServicePort in it;
// "del <id>" closes it. It answers "ok" or the error.
type serviceProxy struct {
	socket, target string
	l              net.Listener

	// mu guards pods, the listeners by pod sandbox ID.
	mu   sync.Mutex
	pods map[string]net.Listener
}

func startServiceProxy(socket, target string) (*serviceProxy, error) {
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	p := &serviceProxy{socket: socket, target: target, l: l, pods: map[string]net.Listener{}}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(conn.(*net.UnixConn))
		}
	}()
	return p, nil
}

func (p *serviceProxy) serve(conn *net.UnixConn) {
	defer conn.Close()
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	var fd = -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
		if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
			fd = fds[0]
		}
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	verb, id, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
	err = nil
	switch {
	case verb == "add" && fd >= 0:
		err = p.add(id, fd)
	case verb == "del":
		p.del(id)
	default:
		err = fmt.Errorf("unknown request %q", buf[:n])
	}
	reply := "ok"
	if err != nil {
		reply = err.Error()
	}
	io.WriteString(conn, reply+"\n")
}

// add listens in the network namespace netns for the pod sandbox id.
func (p *serviceProxy) add(id string, netns int) error {
	p.del(id)
	l, err := listenIn(netns, fmt.Sprintf("%s:%d", kubernetesServiceIP, kubernetesServicePort))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pods[id] = l
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return nil
}

// del closes the listener of the pod sandbox id, which lets its network
// namespace go; a no-op for one without.
func (p *serviceProxy) del(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.pods[id]; l != nil {
		l.Close()
		delete(p.pods, id)
	}
}

func (p *serviceProxy) forward(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
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

// close stops serving and closes every listener.
func (p *serviceProxy) close() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, l := range p.pods {
		l.Close()
		delete(p.pods, id)
	}
	os.Remove(p.socket)
}

// listenIn opens a TCP listener on addr inside the network namespace
// netns. It runs on an OS thread of its own that enters the namespace and
// is never used again: the listener keeps the namespace, the thread ends.
func listenIn(netns int, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("entering the pod's network namespace: %w", err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}
