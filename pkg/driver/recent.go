package driver

import (
	"time"

	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/locks"
)

// poolMetricsAge is how old the pools' status served on the HTTP address
// (in /metrics, and /status/pools with --http-status) may be. Reading it stats every image of every pool (and maps each one's
// extents where the pool reflinks), and /metrics is served on the HTTP
// address, which most pods reach: scrapes at once share one gathering
// (metrics.Handler), and this bounds scrapes back to back to one reading
// every poolMetricsAge. Prometheus scrapes every 15 to 60 s.
const poolMetricsAge = 5 * time.Second

// recent returns read, called again only once its last result is maxAge
// old: the callers meanwhile get that result, which they must not change.
// One call of read runs at a time.
func recent[T any](read func() T, maxAge time.Duration, clk clock.PassiveClock) func() T {
	var (
		mu   locks.Mutex // guards at and last
		at   time.Time
		last T
	)
	return func() T {
		mu.Lock()
		defer mu.Unlock()
		if at.IsZero() || clk.Since(at) >= maxAge {
			last, at = read(), clk.Now()
		}
		return last
	}
}
