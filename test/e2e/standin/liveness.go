package standin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// livenessFlags are the flags of livenessprobe v2.19.0 (cmd/livenessprobe)
// its stand-in implements, with the release's defaults.
var livenessFlags = map[string]flagSpec{
	"csi-address": csiFlag,
	// Empty: the release serves on --health-port, 9808.
	"http-endpoint": {stringFlag, ""},
	"probe-timeout": {durationFlag, "3s"},
}

// livenessDefaultAddr is where livenessprobe serves without
// --http-endpoint: all addresses, --health-port's default.
const livenessDefaultAddr = "0.0.0.0:9808"

// liveness answers /healthz as livenessprobe does: Probe of the driver
// at addr (--csi-address), through a connection of its own, within
// timeout (--probe-timeout).
type liveness struct {
	addr    string
	timeout time.Duration
}

// healthz answers 200 when Probe answers ready (or without saying), and
// 500 with the reason when it fails, times out or answers not ready. It
// connects anew for each request, as the release does, so that a driver
// started again is reached at once.
func (l liveness) healthz(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), l.timeout)
	defer cancel()
	conn, err := csiConn(l.addr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	// The connection, too, within the timeout.
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	case resp.GetReady() != nil && !resp.GetReady().GetValue():
		http.Error(w, "driver responded but is not ready", http.StatusInternalServerError)
	default:
		fmt.Fprint(w, "ok")
	}
}

// runLiveness does what livenessprobe does: /healthz on --http-endpoint
// (or livenessDefaultAddr) asks Probe of the CSI socket.
func runLiveness(ctx context.Context, a args) error {
	addr := a.string("http-endpoint")
	if addr == "" {
		addr = livenessDefaultAddr
	}
	l := liveness{addr: a.string("csi-address"), timeout: a.duration("probe-timeout")}
	if err := serveHTTP(ctx, addr, "/healthz", l.healthz); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
