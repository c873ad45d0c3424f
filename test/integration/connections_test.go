package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// TestConnectionPerCall calls the plugin the kubelet's way: a connection
// of its own for every call (k8s.io/kubernetes pkg/volume/csi,
// newV1NodeClient), each stage holding its connection while it waits. Twice
// --max-requests stages at once, of a static volume whose disk is not there
// yet, so that every admitted one waits: the plugin admits --max-requests of
// them and refuses the rest at once (RESOURCE_EXHAUSTED, which the kubelet
// retries), rather than leaving them unaccepted; and meanwhile its liveness
// check (/livez, which dials the CSI socket), and a quick call on a
// connection of its own (the NodeGetCapabilities the kubelet makes before
// each stage), are still answered. Before, at most 64 connections were
// accepted: the waiting stages held them all, the rest of the calls waited
// to be accepted, and /livez failed until the kubelet restarted the plugin.
func TestConnectionPerCall(t *testing.T) {
	const maxRequests, n = 64, 128
	p := testenv.New(t)
	byID := mkdir(t, filepath.Join(p.Dir, "by-id"))
	p.Args = append(p.Args, "--max-requests", strconv.Itoa(maxRequests), "--allowed-device-prefix", byID)
	p.Start()
	staging := mkdir(t, filepath.Join(p.Root, "staging-per-call"))
	req := &csi.NodeStageVolumeRequest{VolumeId: "vol-per-call", StagingTargetPath: staging, VolumeCapability: rwo,
		VolumeContext: map[string]string{contract.DeviceKey: filepath.Join(byID, "not-attached-yet")}}
	rss := residentKiB(t, p.PID())

	// dial is the kubelet's newGrpcConn: a new connection, closed after
	// its one call.
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient("unix://"+p.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		must(t, "dialling the plugin", err)
		return conn
	}
	flood, cancel := context.WithCancel(context.Background())
	defer cancel()
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			conn := dial()
			defer conn.Close()
			_, err := csi.NewNodeClient(conn).NodeStageVolume(flood, req)
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		})
	}
	refused := func() int {
		mu.Lock()
		defer mu.Unlock()
		return codesSeen[codes.ResourceExhausted]
	}
	waiting := func() int { return int(gauge(t, p, "converge_node_requests_waiting")) }
	last, moved := -1, time.Now()
	for {
		r, w := refused(), waiting()
		if r+w == n {
			break
		}
		if r+w != last {
			last, moved = r+w, time.Now()
		} else if time.Since(moved) > 30*time.Second {
			t.Fatalf("%d stages refused and %d waiting for 30 s, of %d: the rest are not answered", r, w, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w, r := waiting(), refused(); w != maxRequests || r != n-maxRequests {
		t.Errorf("stages: %d waiting and %d refused, want %d and %d", w, r, maxRequests, n-maxRequests)
	}
	t.Logf("resident memory %d KiB with %d stages waiting, each on its own connection; %d KiB before", residentKiB(t, p.PID()), maxRequests, rss)

	if code, body := p.StatusGet("/livez"); code != 200 {
		t.Errorf("/livez with %d stages waiting: got %d %q, want 200", maxRequests, code, body)
	}
	quick, cancelQuick := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelQuick()
	conn := dial()
	defer conn.Close()
	if _, err := csi.NewNodeClient(conn).NodeGetCapabilities(quick, &csi.NodeGetCapabilitiesRequest{}); err != nil {
		t.Errorf("NodeGetCapabilities on a new connection with %d stages waiting: %v", maxRequests, err)
	}
	cancel()
	wg.Wait()
	// The clients have gone; the plugin lets go of their requests as it
	// sees each connection close, a moment later on a loaded machine
	// (make test runs its lanes side by side): until then a new request
	// is refused, as the kubelet's would be, and retried.
	if err := poll.Wait(context.Background(), 30*time.Second, 10*time.Millisecond, func() error {
		if w := waiting(); w > 0 {
			return fmt.Errorf("%d stages still waiting after their clients went", w)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	unstage(t, p, req.VolumeId, staging)
}
