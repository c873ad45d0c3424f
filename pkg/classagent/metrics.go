package classagent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the node agent's own metrics, served on its --http-address
// beside /readyz.
type Metrics struct {
	handFailures prometheus.Counter
}

// NewMetrics registers the node agent's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		handFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_node_agent_hand_failures_total",
			Help: "Hands of a VolumeAttributesClass (or of no limit) to this node's csi-node that failed, each retried with backoff."}),
	}
	reg.MustRegister(m.handFailures)
	return m
}

// handFailed counts a hand that failed; on nil Metrics it is a no-op.
func (m *Metrics) handFailed() {
	if m != nil {
		m.handFailures.Inc()
	}
}
