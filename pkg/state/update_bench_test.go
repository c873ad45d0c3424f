package state

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkUpdate measures one durable intent write on the disk of the
// test's temporary directory, the floor under every mutating RPC's
// latency: through the log (one write and one fdatasync), and written
// straight into bbolt as a log too small for any record does (one
// transaction: its pages, an fdatasync, its meta page, another), both in
// one run, with their ratio.
func BenchmarkUpdate(b *testing.B) {
	var perWrite [2]float64
	for i, size := range []int64{0, DefaultLogSize} {
		name := map[int64]string{0: "bbolt", DefaultLogSize: "log"}[size]
		b.Run(name, func(b *testing.B) {
			s, err := open(filepath.Join(b.TempDir(), "state.db"), size, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			n := 0
			for b.Loop() {
				n++
				_, err := s.Update("vol", func(v *Volume) error {
					v.Publishes = map[string]*Publish{fmt.Sprintf("/t/%d", n): {}}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			perWrite[i] = float64(b.Elapsed()) / float64(b.N)
			if i == 1 && perWrite[0] > 0 {
				b.ReportMetric(perWrite[1]/perWrite[0], "log/bbolt")
			}
		})
	}
}
