package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
