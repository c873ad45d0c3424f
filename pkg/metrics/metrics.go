package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/converge-csi/converge/pkg/volstatus"
)

// namespace prefixes every metric name.
const namespace = "converge"

// Metrics holds the collectors, registered in Registry.
type Metrics struct {
	// Registry holds converge's metrics and the Go runtime's.
	Registry *prometheus.Registry

	operations *prometheus.HistogramVec
	repairs    *prometheus.CounterVec
	passes     prometheus.Histogram
	volumes    *prometheus.GaugeVec
	intents    *prometheus.GaugeVec
	backoff    prometheus.Gauge
	uncertain  prometheus.Gauge
	rpcs       *prometheus.HistogramVec
	frozen     prometheus.Histogram
	conditions *prometheus.GaugeVec
	early      *prometheus.CounterVec
	// ioLimits and ioApplied are each limited volume's IO limits, as
	// asked for and as in force in its pods' cgroups.
	ioLimits  *prometheus.GaugeVec
	ioApplied *prometheus.GaugeVec
}

// New makes the collectors and registers them.
func New() *Metrics {
	// Buckets from 1 ms (a bind mount) to about a minute (mkfs of a large
	// volume, fsck).
	opBuckets := prometheus.ExponentialBuckets(0.001, 2.5, 13)
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "operation_duration_seconds",
			Help:    "Duration of reconciler operations, by action and result (ok, error, terminal).",
			Buckets: opBuckets,
		}, []string{"operation", "result"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "repairs_total",
			Help: "Repairs the reconciler made on its own, by action.",
		}, []string{"action"}),
		passes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconcile_pass_duration_seconds",
			Help:    "Duration of one reconcile pass (observe, diff, start operations).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}),
		volumes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volumes",
			Help: "Volumes with a record, by phase.",
		}, []string{"phase"}),
		intents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "intents",
			Help: "Stages and publishes, as desired and as fulfilled.",
		}, []string{"kind", "state"}),
		backoff: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "operations_in_backoff",
			Help: "Volumes whose latest failed operation waits out its backoff.",
		}),
		uncertain: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volumes_uncertain",
			Help: "Volumes whose latest operation failed and will be retried.",
		}),
		frozen: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "snapshot_freeze_duration_seconds",
			Help:    "How long a snapshot held a volume's filesystem frozen (its pods' writes waited).",
			Buckets: opBuckets,
		}),
		rpcs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "rpc_duration_seconds",
			Help:    "Duration of CSI calls, by method and gRPC code.",
			Buckets: opBuckets,
		}, []string{"method", "code"}),
		conditions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "volume_conditions",
			Help: "Volumes whose condition is abnormal, by reason (PoolNearlyFull, SpaceRanOut, FilesystemReadOnly...), as of the last pass.",
		}, []string{"reason"}),
		early: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "early_starts_total",
			Help: "Requests' early starts of their volume's step, by outcome (started, waited, nothing_to_do, left_to_pass).",
		}, []string{"outcome"}),
	}
	m.ioLimits = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "volume_io_limit",
		Help: "IO limits a volume's class asks for, per second, by kind (read_iops, write_iops, read_bps, write_bps); 0 is none.",
	}, []string{"volume", "kind"})
	m.ioApplied = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "volume_io_limit_applied",
		Help: "IO limits in force in every cgroup of the pods that publish a volume, per second, by kind; 0 is none (or not in force everywhere); no series while no pod publishes it.",
	}, []string{"volume", "kind"})
	m.Registry.MustRegister(m.operations, m.repairs, m.passes, m.volumes, m.intents, m.backoff, m.uncertain, m.rpcs, m.frozen, m.conditions, m.early, m.ioLimits, m.ioApplied,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, p := range volstatus.Phases {
		m.volumes.WithLabelValues(p)
	}
	return m
}

// OperationDone implements reconciler.Recorder.
func (m *Metrics) OperationDone(action, result string, d time.Duration) {
	m.operations.WithLabelValues(action, result).Observe(d.Seconds())
}

// EarlyStart implements reconciler.Recorder.
func (m *Metrics) EarlyStart(outcome string) { m.early.WithLabelValues(outcome).Inc() }

// Frozen implements reconciler.Recorder.
func (m *Metrics) Frozen(d time.Duration) { m.frozen.Observe(d.Seconds()) }

// Repaired implements reconciler.Recorder.
func (m *Metrics) Repaired(action string) { m.repairs.WithLabelValues(action).Inc() }

// PassDone implements reconciler.Recorder.
func (m *Metrics) PassDone(d time.Duration, volumes []volstatus.VolumeStatus, inBackoff int) {
	m.passes.Observe(d.Seconds())
	phases := make(map[string]int, len(volstatus.Phases))
	var stages, stagesReady, publishes, published, uncertain int
	reasons := map[string]int{}
	for _, v := range volumes {
		phases[v.Phase]++
		if v.Reason != "" {
			reasons[v.Reason]++
		}
		if v.StagingPath != "" {
			stages++
		}
		if v.StageReady {
			stagesReady++
		}
		publishes += v.PublishesDesired
		published += v.PublishesActual
		if v.LastError != "" {
			uncertain++
		}
	}
	for _, p := range volstatus.Phases {
		m.volumes.WithLabelValues(p).Set(float64(phases[p]))
	}
	m.intents.WithLabelValues("stage", "desired").Set(float64(stages))
	m.intents.WithLabelValues("stage", "actual").Set(float64(stagesReady))
	m.intents.WithLabelValues("publish", "desired").Set(float64(publishes))
	m.intents.WithLabelValues("publish", "actual").Set(float64(published))
	m.backoff.Set(float64(inBackoff))
	m.uncertain.Set(float64(uncertain))
	// A reason no volume has any more leaves the metric.
	m.conditions.Reset()
	for r, n := range reasons {
		m.conditions.WithLabelValues(r).Set(float64(n))
	}
	// A volume no longer limited, or gone, leaves them; a limited volume
	// no pod publishes has no applied series (no cgroup to be in force
	// in), so that desired without applied tells it from one whose pods
	// are not held to its limits (0).
	m.ioLimits.Reset()
	m.ioApplied.Reset()
	for _, v := range volumes {
		if v.IOLimitsDesired == nil {
			continue
		}
		setIOLimits(m.ioLimits, v.ID, *v.IOLimitsDesired)
		if v.PublishesDesired == 0 {
			continue
		}
		applied := volstatus.IOLimits{}
		if v.IOLimitsApplied != nil {
			applied = *v.IOLimitsApplied
		}
		setIOLimits(m.ioApplied, v.ID, applied)
	}
}

// setIOLimits sets the gauges of vec for volume id to l, one per kind.
func setIOLimits(vec *prometheus.GaugeVec, id string, l volstatus.IOLimits) {
	for kind, v := range map[string]uint64{"read_iops": l.ReadIOPS, "write_iops": l.WriteIOPS, "read_bps": l.ReadBPS, "write_bps": l.WriteBPS} {
		vec.WithLabelValues(id, kind).Set(float64(v))
	}
}

// WatchReady reports, at each scrape, whether start-up reconstruction is
// done (converge_ready): the plugin answers Probe ready, and the kubelet's
// calls, only then.
func (m *Metrics) WatchReady(ready func() bool) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "ready",
		Help: "1 once start-up reconstruction is done and the plugin serves, 0 before.",
	}, func() float64 {
		if ready() {
			return 1
		}
		return 0
	}))
}

// WatchRequests reports, at each scrape, the node requests waiting for the
// reconciler (converge_node_requests_waiting) and how many may wait at once
// (converge_node_requests_limit, --max-requests): at the limit, more are
// refused RESOURCE_EXHAUSTED.
func (m *Metrics) WatchRequests(waiting func() int, limit int) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "node_requests_waiting",
		Help: "Node requests waiting for the reconciler, each holding one of --max-requests slots.",
	}, func() float64 { return float64(waiting()) }))
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "node_requests_limit",
		Help: "Node requests that may wait for the reconciler at once (--max-requests); more are refused RESOURCE_EXHAUSTED.",
	}, func() float64 { return float64(limit) }))
}

// WatchPools reports every storage pool's space, read from pools at each
// scrape: converge_data_directory_bytes by pool and kind,
// converge_data_directory_nearly_full, converge_snapshots and
// converge_restores by pool, and converge_restore_copied_bytes by restore;
// and converge_data_directory_unreadable, 1 for a pool whose space could
// not be read (PoolStatus.Error), which then has no other. The names say
// "data directory", as they did when a node had one pool, its data
// directory: they are published (alerts and dashboards read them), and
// each is a storage pool's.
func (m *Metrics) WatchPools(pools func() []volstatus.PoolStatus) {
	m.Registry.MustRegister(poolCollector(pools))
}

var (
	poolBytes = prometheus.NewDesc(namespace+"_data_directory_bytes",
		"Space of a storage pool by kind: size, free, guard (kept free: promised to no volume), promised_thick, owed_thick (not yet allocated, or shared with snapshots), promised_thin, allocated_thin (written and not shared), available_thick and available_thin (what GetCapacity answers: what is left above the guard), snapshots (what the snapshots allocate), copying_snapshots (promised to the snapshots being taken).",
		[]string{"pool", "kind"}, nil)
	snapshotCount = prometheus.NewDesc(namespace+"_snapshots",
		"Snapshots kept in a storage pool.", []string{"pool"}, nil)
	poolNearlyFull = prometheus.NewDesc(namespace+"_data_directory_nearly_full",
		"1 while a storage pool's free space is below its guard: its thin volumes are reported and no volume is created or grown in it.", []string{"pool"}, nil)
	restoreCount = prometheus.NewDesc(namespace+"_restores",
		"Volumes being copied from a snapshot in a storage pool.", []string{"pool"}, nil)
	poolUnreadable = prometheus.NewDesc(namespace+"_data_directory_unreadable",
		"1 while a storage pool's space cannot be read (its filesystem failing, its directory gone; csi-node status says why): its other metrics are then missing.", []string{"pool"}, nil)
	restoreCopied = prometheus.NewDesc(namespace+"_restore_copied_bytes",
		"What a restore's copy holds so far of its snapshot's data; one that stops growing is stuck.", []string{"pool", "volume", "snapshot"}, nil)
)

type poolCollector func() []volstatus.PoolStatus

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolUnreadable
	ch <- poolBytes
	ch <- poolNearlyFull
	ch <- snapshotCount
	ch <- restoreCount
	ch <- restoreCopied
}

// Collect sends every pool's metrics. A pool that could not be read is
// unreadable and has no other: an error from a collector would fail the
// whole scrape, and with it every alert on the node, the data-loss ones
// among them, when one disk fails.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c() {
		unreadable := 0.0
		if p.Error != "" {
			unreadable = 1
		}
		ch <- prometheus.MustNewConstMetric(poolUnreadable, prometheus.GaugeValue, unreadable, p.Name)
		if p.Error == "" {
			collectPool(ch, p)
		}
	}
}

// collectPool sends the metrics of one pool.
func collectPool(ch chan<- prometheus.Metric, p volstatus.PoolStatus) {
	for kind, v := range map[string]int64{
		"size": p.SizeBytes, "free": p.FreeBytes, "guard": p.GuardBytes,
		"promised_thick": p.ThickPromisedBytes, "owed_thick": p.ThickOwedBytes,
		"promised_thin": p.ThinPromisedBytes, "allocated_thin": p.ThinAllocatedBytes,
		"available_thick": p.ThickAvailableBytes, "available_thin": p.ThinAvailableBytes,
		"snapshots": p.SnapshotBytes, "copying_snapshots": p.CopyingBytes,
	} {
		ch <- prometheus.MustNewConstMetric(poolBytes, prometheus.GaugeValue, float64(v), p.Name, kind)
	}
	full := 0.0
	if p.NearlyFull {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(poolNearlyFull, prometheus.GaugeValue, full, p.Name)
	ch <- prometheus.MustNewConstMetric(snapshotCount, prometheus.GaugeValue, float64(p.Snapshots), p.Name)
	ch <- prometheus.MustNewConstMetric(restoreCount, prometheus.GaugeValue, float64(len(p.Restores)), p.Name)
	for _, r := range p.Restores {
		ch <- prometheus.MustNewConstMetric(restoreCopied, prometheus.GaugeValue, float64(r.CopiedBytes), p.Name, r.VolumeID, r.SnapshotID)
	}
}

// RPCDone records one CSI call.
func (m *Metrics) RPCDone(method, code string, d time.Duration) {
	m.rpcs.WithLabelValues(method, code).Observe(d.Seconds())
}

// Handler serves the metrics in the Prometheus text format. Scrapes at
// once share one gathering (promhttp's CoalesceGather, experimental in
// client_golang v1.25): each reads every pool's images and the store's
// records, and the address is usually reachable from every pod, so a flood
// of scrapes gathers once at a time, while every scraper, Prometheus's
// among them, is answered.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{CoalesceGather: true})
}
