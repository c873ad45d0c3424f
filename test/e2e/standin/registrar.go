package standin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrar speaks the kubelet's plugin-registration protocol for csi-node,
// as node-driver-registrar does in deploy/ (its image cannot be fetched
// here): it serves <kubelet-dir>/plugins_registry/<driver>-reg.sock, which
// the kubelet's plugin watcher finds, asks GetInfo of, and answers with
// NotifyRegistrationStatus. Removing the socket deregisters the driver.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint, socket string
	srv                      *grpc.Server

	// mu guards events.
	mu     sync.Mutex
	events []string
}

// serveRegistration serves <dir>/<driver>-reg.sock, the kubelet's plugin
// registration directory as the registrar sees it.
func serveRegistration(dir, driver, endpoint string) (*registrar, error) {
	r := &registrar{
		driver:   driver,
		endpoint: endpoint,
		socket:   filepath.Join(dir, driver+"-reg.sock"),
	}
	os.Remove(r.socket)
	l, err := net.Listen("unix", r.socket)
	if err != nil {
		return nil, err
	}
	r.srv = grpc.NewServer()
	registerapi.RegisterRegistrationServer(r.srv, r)
	go r.srv.Serve(l)
	return r, nil
}

func (r *registrar) record(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// registered counts the kubelet's successful registrations so far.
func (r *registrar) registered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == "registered" {
			n++
		}
	}
	return n
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.record("GetInfo")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.record("registered")
	} else {
		r.record(fmt.Sprintf("refused: %s", s.Error))
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// stop stops serving and removes the socket: the kubelet deregisters.
func (r *registrar) stop() {
	if r == nil {
		return
	}
	r.srv.Stop()
	os.Remove(r.socket)
}
