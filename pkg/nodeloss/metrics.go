package nodeloss

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-csi/converge/pkg/contract"
)

// Metrics are converge-controller's own metrics.
type Metrics struct {
	passes  prometheus.Counter
	lost    *prometheus.GaugeVec
	actions *prometheus.CounterVec
	failed  *prometheus.CounterVec
	// Leader is 1 while this replica leads, 0 otherwise.
	Leader prometheus.Gauge
}

// NewMetrics registers converge-controller's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_controller_passes_total",
			Help: "Passes over the driver's volumes."}),
		lost: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_controller_volumes_on_lost_nodes",
			Help: "The driver's volumes whose node is gone, by their on-node-loss choice, at the last pass."}, []string{"on_node_loss"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_controller_actions_total",
			Help: "Actions carried out on volumes whose node is gone, or will be unless it comes back (warnings are counted once per volume and what they say)."}, []string{"action"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_controller_action_failures_total",
			Help: "Actions that failed and are retried at the next pass."}, []string{"action"}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_controller_leader",
			Help: "1 while this replica leads (holds the Lease), 0 otherwise."}),
	}
	reg.MustRegister(m.passes, m.lost, m.actions, m.failed, m.Leader)
	for _, c := range []contract.OnNodeLoss{contract.OnNodeLossRetain, contract.OnNodeLossRelease} {
		m.lost.WithLabelValues(string(c))
	}
	for _, k := range kinds {
		m.actions.WithLabelValues(k.String())
		m.failed.WithLabelValues(k.String())
	}
	return m
}

// pass records a pass's decision.
func (m *Metrics) pass(d Decision) {
	m.passes.Inc()
	for _, c := range []contract.OnNodeLoss{contract.OnNodeLossRetain, contract.OnNodeLossRelease} {
		m.lost.WithLabelValues(string(c)).Set(float64(d.OnLost[c]))
	}
}

// acted records an action carried out, or failed.
func (m *Metrics) acted(k Kind, err error) {
	if err != nil {
		m.failed.WithLabelValues(k.String()).Inc()
		return
	}
	m.actions.WithLabelValues(k.String()).Inc()
}
