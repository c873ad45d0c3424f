package standin

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestLivenessHealthz: /healthz, which deploy/ serves on --http-endpoint,
// answers as livenessprobe v2.19.0 does: 200 while Probe answers ready,
// 500 once it answers not ready; each Probe given --probe-timeout, which
// deploy/ leaves at the release's default, 3s.
func TestLivenessHealthz(t *testing.T) {
	release, _ := releaseNamed("livenessprobe")
	a, err := parseArgs(release, livenessFlags, deployArgs(t, "liveness-probe"))
	if err != nil {
		t.Fatal(err)
	}
	d := startDriver(t)
	l := liveness{addr: "unix://" + d.socket, timeout: a.duration("probe-timeout")}
	for _, ready := range []bool{true, false} {
		d.setReady(ready)
		w := httptest.NewRecorder()
		l.healthz(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if want := map[bool]int{true: http.StatusOK, false: http.StatusInternalServerError}[ready]; w.Code != want {
			t.Errorf("Probe ready %v: /healthz %d %q, want %d", ready, w.Code, w.Body, want)
		}
	}
	for _, c := range d.called("Probe") {
		if want := 3 * time.Second; !within(c.left, want) {
			t.Errorf("Probe given %v, want %v", c.left, want)
		}
	}
	if n := len(d.called("Probe")); n != 2 {
		t.Errorf("%d Probe calls, want 2", n)
	}
}
