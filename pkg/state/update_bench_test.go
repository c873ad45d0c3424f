package state

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkUpdate measures one durable intent write (a bbolt transaction
// with its fsyncs) on the disk of the test's temporary directory: the floor
// under every mutating RPC's latency.
func BenchmarkUpdate(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	i := 0
	for b.Loop() {
		i++
		_, err := s.Update("vol", func(v *Volume) error {
			v.Publishes = map[string]*Publish{fmt.Sprintf("/t/%d", i): {}}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
