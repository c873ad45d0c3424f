package driver

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestRecentReadsOncePerAge: calls within maxAge of a reading get its
// result without reading again; the first call after that reads anew.
func TestRecentReadsOncePerAge(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	reads := 0
	get := recent(func() int { reads++; return reads }, 5*time.Second, clk)
	for _, step := range []struct {
		name    string
		advance time.Duration
		want    int
	}{
		{"first call", 0, 1},
		{"at once", 0, 1},
		{"4.9 s later", 4900 * time.Millisecond, 1},
		{"5 s after the reading", 100 * time.Millisecond, 2},
		{"just after", time.Millisecond, 2},
	} {
		clk.SetTime(clk.Now().Add(step.advance))
		if got := get(); got != step.want {
			t.Errorf("%s: got reading %d, want %d", step.name, got, step.want)
		}
	}
	if reads != 2 {
		t.Errorf("reads: got %d, want 2", reads)
	}
}
