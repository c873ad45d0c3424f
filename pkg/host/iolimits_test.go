package host

import (
	"math"
	"strings"
	"testing"
)

// TestIOLimits checks the zero value, the bounds the kernel can hold and
// the form the limits are logged in.
func TestIOLimits(t *testing.T) {
	for _, c := range []struct {
		name    string
		l       IOLimits
		zero    bool
		bad     string // in Check's error; "" for none
		printed string
	}{
		{name: "none", l: IOLimits{}, zero: true, printed: "riops=max wiops=max rbps=max wbps=max"},
		{name: "some", l: IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20}, printed: "riops=200 wiops=max rbps=max wbps=1048576"},
		{name: "iops at most", l: IOLimits{WriteIOPS: MaxIOPS}, printed: "riops=max wiops=4294967294 rbps=max wbps=max"},
		{name: "iops UINT_MAX", l: IOLimits{ReadIOPS: math.MaxUint32}, bad: "read IOPS"},
		{name: "iops 2^32", l: IOLimits{WriteIOPS: 1 << 32}, bad: "write IOPS"},
		{name: "bps at most", l: IOLimits{ReadBPS: MaxBPS}, printed: "riops=max wiops=max rbps=18446744073709551614 wbps=max"},
		{name: "bps U64_MAX", l: IOLimits{WriteBPS: math.MaxUint64}, bad: "write bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.l.IsZero(); got != c.zero {
				t.Errorf("IsZero: got %v, want %v", got, c.zero)
			}
			err := c.l.Check()
			if (err != nil) != (c.bad != "") || (err != nil && !strings.Contains(err.Error(), c.bad)) {
				t.Errorf("Check: got %v, want an error naming %q", err, c.bad)
			}
			if c.printed != "" && c.l.String() != c.printed {
				t.Errorf("String: got %q, want %q", c.l.String(), c.printed)
			}
		})
	}
}
