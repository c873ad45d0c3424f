package standin

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeDriver is a CSI driver for the stand-ins' tests, served on a Unix
// socket as csi-node is: it records each call with the time its caller
// left it (the deadline the request carries), and answers as set.
type fakeDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	// socket is where it serves.
	socket string
	// capacity is GetCapacity's answer.
	capacity int64

	// mu guards ready and calls.
	mu sync.Mutex
	// ready is Probe's answer.
	ready bool
	calls []driverCall
}

// driverCall is one call the fake driver answered.
type driverCall struct {
	method string
	req    any
	// left is the time from the call's arrival to its deadline; 0 for
	// a call without one.
	left time.Duration
}

// startDriver serves a fakeDriver until the test ends.
func startDriver(t *testing.T) *fakeDriver {
	d := &fakeDriver{socket: filepath.Join(t.TempDir(), "csi.sock"), capacity: 1 << 30, ready: true}
	l, err := net.Listen("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return d
}

// conn connects to the driver as a stand-in does, through --csi-address.
func (d *fakeDriver) conn(t *testing.T) *grpc.ClientConn {
	conn, err := csiConn("unix://" + d.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (d *fakeDriver) record(ctx context.Context, method string, req any) {
	var left time.Duration
	if deadline, ok := ctx.Deadline(); ok {
		left = time.Until(deadline)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, driverCall{method, req, left})
}

// setReady sets Probe's answer.
func (d *fakeDriver) setReady(ready bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready = ready
}

// String is the call's method and the time it was given, for a test's
// failure.
func (c driverCall) String() string { return fmt.Sprintf("%s given %v", c.method, c.left) }

// called returns the calls of method so far.
func (d *fakeDriver) called(method string) []driverCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []driverCall
	for _, c := range d.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (d *fakeDriver) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	d.record(ctx, "Probe", req)
	d.mu.Lock()
	defer d.mu.Unlock()
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(d.ready)}, nil
}

func (d *fakeDriver) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	d.record(ctx, "GetPluginInfo", req)
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: "test"}, nil
}

func (d *fakeDriver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d.record(ctx, "CreateVolume", req)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-" + req.Name, CapacityBytes: req.GetCapacityRange().GetRequiredBytes(),
		AccessibleTopology: req.GetAccessibilityRequirements().GetPreferred()}}, nil
}

func (d *fakeDriver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d.record(ctx, "DeleteVolume", req)
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *fakeDriver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	d.record(ctx, "GetCapacity", req)
	return &csi.GetCapacityResponse{AvailableCapacity: d.capacity}, nil
}

func (d *fakeDriver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	d.record(ctx, "ControllerExpandVolume", req)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
}

// within says whether left, the time a call was given, is what a timeout
// of want leaves once the call has arrived: no more than want, and not
// much less (the call's way takes far less than a second, or a tenth of
// want, here).
func within(left, want time.Duration) bool {
	return left <= want && left > want-max(want/10, time.Second)
}
