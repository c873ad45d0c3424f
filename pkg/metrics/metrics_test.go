package metrics

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converge-csi/converge/pkg/volstatus"
)

func TestMetricsFollowTheReconciler(t *testing.T) {
	m := New()
	m.OperationDone("stage", "ok", 30*time.Millisecond)
	m.OperationDone("stage", "error", time.Millisecond)
	m.Repaired("keep device")
	m.EarlyStart("started")
	m.EarlyStart("started")
	m.EarlyStart("left_to_pass")
	m.PassDone(2*time.Millisecond, []volstatus.VolumeStatus{
		{ID: "a", Phase: volstatus.PhaseReady, StagingPath: "/s/a", StageReady: true, PublishesDesired: 2, PublishesActual: 2},
		{ID: "b", Phase: volstatus.PhaseFailing, StagingPath: "/s/b", PublishesDesired: 1, LastError: "busy"},
		{ID: "c", Phase: volstatus.PhaseIdle},
	}, 1)
	m.RPCDone("/csi.v1.Node/NodeStageVolume", "OK", time.Millisecond)

	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"ready volumes", testutil.ToFloat64(m.volumes.WithLabelValues(volstatus.PhaseReady)), 1},
		{"failing volumes", testutil.ToFloat64(m.volumes.WithLabelValues(volstatus.PhaseFailing)), 1},
		{"tearing-down volumes", testutil.ToFloat64(m.volumes.WithLabelValues(volstatus.PhaseTearingDown)), 0},
		{"desired stages", testutil.ToFloat64(m.intents.WithLabelValues("stage", "desired")), 2},
		{"actual stages", testutil.ToFloat64(m.intents.WithLabelValues("stage", "actual")), 1},
		{"desired publishes", testutil.ToFloat64(m.intents.WithLabelValues("publish", "desired")), 3},
		{"actual publishes", testutil.ToFloat64(m.intents.WithLabelValues("publish", "actual")), 2},
		{"in backoff", testutil.ToFloat64(m.backoff), 1},
		{"uncertain", testutil.ToFloat64(m.uncertain), 1},
		{"repairs", testutil.ToFloat64(m.repairs.WithLabelValues("keep device")), 1},
		{"early starts started", testutil.ToFloat64(m.early.WithLabelValues("started")), 2},
		{"early starts left to the pass", testutil.ToFloat64(m.early.WithLabelValues("left_to_pass")), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.operations); n != 2 {
		t.Errorf("operation series: got %d, want 2 (stage ok, stage error)", n)
	}
	names, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range names {
		if n := f.GetName(); !strings.HasPrefix(n, "converge_") && !strings.HasPrefix(n, "go_") && !strings.HasPrefix(n, "process_") {
			t.Errorf("metric %s lacks the converge_ prefix", n)
		}
	}
}

func TestMetricNamesFollowConventions(t *testing.T) {
	m := New()
	m.OperationDone("stage", "ok", time.Millisecond)
	m.RPCDone("/csi.v1.Node/NodeStageVolume", "OK", time.Millisecond)
	m.Repaired("keep device")
	problems, err := testutil.GatherAndLint(m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "converge_") {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}

// TestWhatAlertsRead checks the metrics the alerts read: abnormal volumes
// by reason (a reason gone leaves), readiness, and each pool's restores
// with what each has copied.
func TestWhatAlertsRead(t *testing.T) {
	m := New()
	ready := false
	m.WatchReady(func() bool { return ready })
	m.WatchPools(func() []volstatus.PoolStatus {
		return []volstatus.PoolStatus{{Name: "default"}, {Name: "fast", Restores: []volstatus.Restore{{VolumeID: "v", SnapshotID: "s", CopiedBytes: 4096}}}}
	})
	m.PassDone(time.Millisecond, []volstatus.VolumeStatus{
		{ID: "a", Phase: volstatus.PhaseDegraded, Reason: "PoolNearlyFull"},
		{ID: "b", Phase: volstatus.PhaseDegraded, Reason: "PoolNearlyFull"},
		{ID: "c", Phase: volstatus.PhaseDegraded, Reason: "SpaceRanOut"},
		{ID: "d", Phase: volstatus.PhaseReady},
	}, 0)
	want := `
# HELP converge_volume_conditions Volumes whose condition is abnormal, by reason (PoolNearlyFull, SpaceRanOut, FilesystemReadOnly...), as of the last pass.
# TYPE converge_volume_conditions gauge
converge_volume_conditions{reason="PoolNearlyFull"} 2
converge_volume_conditions{reason="SpaceRanOut"} 1
# HELP converge_ready 1 once start-up reconstruction is done and the plugin serves, 0 before.
# TYPE converge_ready gauge
converge_ready 0
# HELP converge_restores Volumes being copied from a snapshot in a storage pool.
# TYPE converge_restores gauge
converge_restores{pool="default"} 0
converge_restores{pool="fast"} 1
# HELP converge_restore_copied_bytes What a restore's copy holds so far of its snapshot's data; one that stops growing is stuck.
# TYPE converge_restore_copied_bytes gauge
converge_restore_copied_bytes{pool="fast",snapshot="s",volume="v"} 4096
`
	names := []string{"converge_volume_conditions", "converge_ready", "converge_restores", "converge_restore_copied_bytes"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	ready = true
	m.PassDone(time.Millisecond, []volstatus.VolumeStatus{{ID: "c", Phase: volstatus.PhaseDegraded, Reason: "SpaceRanOut"}}, 0)
	want = `
# HELP converge_volume_conditions Volumes whose condition is abnormal, by reason (PoolNearlyFull, SpaceRanOut, FilesystemReadOnly...), as of the last pass.
# TYPE converge_volume_conditions gauge
converge_volume_conditions{reason="SpaceRanOut"} 1
# HELP converge_ready 1 once start-up reconstruction is done and the plugin serves, 0 before.
# TYPE converge_ready gauge
converge_ready 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "converge_volume_conditions", "converge_ready"); err != nil {
		t.Error(err)
	}
}

// TestPoolGuardIsExported checks that each pool's guard, the space kept
// free that no volume is promised, is a kind of its pool's bytes, beside
// what is still available above it.
func TestPoolGuardIsExported(t *testing.T) {
	m := New()
	m.WatchPools(func() []volstatus.PoolStatus {
		return []volstatus.PoolStatus{{Name: "default", SizeBytes: 100 << 20, FreeBytes: 30 << 20, GuardBytes: 20 << 20, ThickAvailableBytes: 10 << 20}}
	})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`converge_data_directory_bytes{kind="guard",pool="default"} 2.097152e+07`,
		`converge_data_directory_bytes{kind="available_thick",pool="default"} 1.048576e+07`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// blocking is a collector whose Collect waits until release is closed.
type blocking struct {
	entered chan struct{}
	release chan struct{}
}

func (b blocking) Describe(ch chan<- *prometheus.Desc) {}

func (b blocking) Collect(ch chan<- prometheus.Metric) {
	b.entered <- struct{}{}
	<-b.release
}

// TestScrapesShareOneGathering: scrapes at once gather once, and each is
// answered.
func TestScrapesShareOneGathering(t *testing.T) {
	const scrapes = 3
	m := New()
	b := blocking{entered: make(chan struct{}, scrapes), release: make(chan struct{})}
	m.Registry.MustRegister(b)
	srv := httptest.NewUnstartedServer(m.Handler())
	var active sync.WaitGroup
	active.Add(scrapes)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateActive {
			active.Done()
		}
	}
	srv.Start()
	defer srv.Close()
	var wg sync.WaitGroup
	for range scrapes {
		wg.Go(func() {
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(srv.URL)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("a scrape: got %s, want 200", resp.Status)
			}
		})
	}
	active.Wait()
	<-b.entered
	// The others reach the handler while the first gathering is held.
	time.Sleep(200 * time.Millisecond)
	close(b.release)
	wg.Wait()
	if n := 1 + len(b.entered); n != 1 {
		t.Errorf("%d scrapes at once gathered %d times, want once", scrapes, n)
	}
}

// TestAnUnreadablePoolHidesNoOther: a pool whose space cannot be read is
// unreadable, with no other metric of its own, and the scrape still
// answers every other metric: a failing disk must not silence the node's
// alerts, the data-loss ones among them.
func TestAnUnreadablePoolHidesNoOther(t *testing.T) {
	m := New()
	m.WatchReady(func() bool { return true })
	m.WatchPools(func() []volstatus.PoolStatus {
		return []volstatus.PoolStatus{{Name: "default", SizeBytes: 100 << 20}, {Name: "fast", Error: "statfs: input/output error"}}
	})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: got %d, want 200: %s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	for _, want := range []string{`converge_data_directory_unreadable{pool="fast"} 1`, `converge_data_directory_unreadable{pool="default"} 0`,
		`converge_data_directory_bytes{kind="size",pool="default"} 1.048576e+08`, "converge_ready 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(body, `kind="size",pool="fast"`) {
		t.Error(`metrics have the unreadable pool's size, want none`)
	}
}

// TestIOLimitsFollowTheVolumes checks the per-volume IO limit gauges: a
// series per kind for each volume that asks for limits, desired, and
// applied (0 where not in force) while a pod publishes it; none for the
// others, none applied for a limited volume no pod publishes (idle: not
// a gap), and none once a volume no longer asks or is gone.
func TestIOLimitsFollowTheVolumes(t *testing.T) {
	m := New()
	m.PassDone(time.Millisecond, []volstatus.VolumeStatus{
		{ID: "a", PublishesDesired: 1, IOLimitsDesired: &volstatus.IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20}, IOLimitsApplied: &volstatus.IOLimits{ReadIOPS: 200}},
		{ID: "b", PublishesDesired: 2, IOLimitsDesired: &volstatus.IOLimits{WriteIOPS: 50}},
		{ID: "c"},
		{ID: "idle", IOLimitsDesired: &volstatus.IOLimits{ReadIOPS: 100}},
	}, 0)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"a read_iops desired", testutil.ToFloat64(m.ioLimits.WithLabelValues("a", "read_iops")), 200},
		{"a write_bps desired", testutil.ToFloat64(m.ioLimits.WithLabelValues("a", "write_bps")), 1 << 20},
		{"a read_iops applied", testutil.ToFloat64(m.ioApplied.WithLabelValues("a", "read_iops")), 200},
		{"a write_bps applied", testutil.ToFloat64(m.ioApplied.WithLabelValues("a", "write_bps")), 0},
		{"b write_iops applied", testutil.ToFloat64(m.ioApplied.WithLabelValues("b", "write_iops")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.ioLimits); n != 12 {
		t.Errorf("desired series: got %d, want 12 (4 kinds of a, b and idle, none of c)", n)
	}
	if n := testutil.CollectAndCount(m.ioApplied); n != 8 {
		t.Errorf("applied series: got %d, want 8 (4 kinds of a and b, none of c or of idle, which no pod publishes)", n)
	}
	// b is gone, a no longer asks: their series go.
	m.PassDone(time.Millisecond, []volstatus.VolumeStatus{{ID: "a"}, {ID: "idle", IOLimitsDesired: &volstatus.IOLimits{ReadIOPS: 100}}}, 0)
	if n := testutil.CollectAndCount(m.ioLimits) + testutil.CollectAndCount(m.ioApplied); n != 4 {
		t.Errorf("series once only idle asks for limits: got %d, want 4 (idle's desired)", n)
	}
	m.PassDone(time.Millisecond, nil, 0)
	if n := testutil.CollectAndCount(m.ioLimits) + testutil.CollectAndCount(m.ioApplied); n != 0 {
		t.Errorf("series once every volume is gone: got %d, want 0", n)
	}
}
