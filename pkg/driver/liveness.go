package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/locks"
)

// livenessTimeout bounds one liveness check: a csi-node that cannot answer
// Probe on its own socket within it is hung (stopped, deadlocked, its
// server wedged). Well under deploy/'s probe timeout (5 s).
const livenessTimeout = 3 * time.Second

// probeSelf asks Identity.Probe of the plugin's own CSI socket, the way the
// kubelet and the sidecars reach it, and is satisfied by any answer, ready
// or not: a start-up reconstruction that takes long (fsck and mounts of
// every staged volume after a reboot) is alive, and readiness (/readyz)
// tells it apart. kubernetes-csi's livenessprobe sidecar asks the same but
// fails while Probe answers not ready, which would restart a long start-up
// in a loop. Each check connects anew, so that no failure before the
// server listened leaves a reconnection backoff behind.
func probeSelf(sock string) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, livenessTimeout)
		defer cancel()
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("a client of %s: %w", sock, err)
		}
		defer conn.Close()
		if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
			return fmt.Errorf("Identity.Probe on the plugin's own socket: %w", err)
		}
		return nil
	}
}

// sharedCheckAge is how long a liveness check's result answers the checks
// that follow it: the kubelet probes every 10 s.
const sharedCheckAge = time.Second

// shareCheck returns check run at most once at a time, and at most once
// within maxAge of its last end, whose result answers every caller
// meanwhile. /livez is served on the HTTP address, which most pods reach:
// each check dials the CSI socket, whose connections the kubelet and the
// sidecars need (reservedConnections), and a flood of /livez would otherwise
// dial once each. The check runs on its own context, so a caller that goes
// away ends no other caller's wait; each caller waits at most as long as
// its own context allows.
func shareCheck(check func(context.Context) error, maxAge time.Duration, clk clock.PassiveClock) func(context.Context) error {
	var (
		mu      locks.Mutex
		at      time.Time
		last    error
		running chan struct{} // closed when the running check ends
	)
	return func(ctx context.Context) error {
		mu.Lock()
		if !at.IsZero() && clk.Since(at) < maxAge {
			err := last
			mu.Unlock()
			return err
		}
		done := running
		if done == nil {
			done = make(chan struct{})
			running = done
			go func() {
				err := errors.New("the liveness check panicked")
				defer func() {
					if p := recover(); p != nil {
						klog.Background().Error(nil, "The liveness check panicked", "panic", p)
					}
					mu.Lock()
					at, last, running = clk.Now(), err, nil
					mu.Unlock()
					close(done)
				}()
				err = check(context.Background())
			}()
		}
		mu.Unlock()
		select {
		case <-done:
			mu.Lock()
			defer mu.Unlock()
			return last
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
