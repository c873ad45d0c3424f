package reconciler

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/converge-csi/converge/pkg/state"
)

// BenchmarkPass measures one reconcile pass over n converged volumes (each
// staged and published) with the fake device layer: observe, diff, publish
// results, start nothing. Cost per volume should stay flat as n grows.
func BenchmarkPass(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
			store, err := state.Open(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			w := newFakeWorld()
			w.started = nil
			w.makeDirs("/k", "/k/staging")
			r, err := New(Config{Store: store, Observer: w, Loops: w, Filesystems: w, Paths: w, Pools: fakePools(w),
				Clock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)), Roots: []string{"/k"}, FastWorkers: 64,
				spawn: func(f func()) { f() }})
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				id := fmt.Sprintf("v%05d", i)
				w.makeImages(id)
				staging, pod := "/k/staging/"+id, "/k/pod-"+id
				w.makeDirs(staging, pod)
				if _, err := store.Update(id, func(v *state.Volume) error {
					v.Stage = &state.Stage{Path: staging, Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
					v.Publishes = map[string]*state.Publish{pod + "/mount": {Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			// Converge: stage, publish (and no grow: mkfs records the size).
			for range 4 {
				if _, err := r.Pass(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			if started, _ := r.Pass(b.Context()); started != 0 {
				b.Fatalf("not converged: a pass started %d operations", started)
			}
			b.ResetTimer()
			for b.Loop() {
				if started, err := r.Pass(b.Context()); err != nil || started != 0 {
					b.Fatalf("pass: %d started, %v", started, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/volume")
		})
	}
}
