package contract

import (
	"slices"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
)

// TestParseIOLimits owns the IO limit parameters of a VolumeAttributesClass:
// every key, whole numbers and (for bytes) quantities, NoLimit, Kubernetes'
// own keys ignored, and every value the kernel would refuse or change
// refused with its key named.
func TestParseIOLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   host.IOLimits
		keys   []string
		// err is a part of the INVALID_ARGUMENT message; "" for none.
		err string
	}{
		{name: "none", params: nil},
		{name: "empty", params: map[string]string{}},
		{name: "every key", params: map[string]string{MaxReadIOPSKey: "100", MaxWriteIOPSKey: "200", MaxReadBPSKey: "1048576", MaxWriteBPSKey: "2097152"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 200, ReadBPS: 1 << 20, WriteBPS: 2 << 20},
			keys: []string{MaxReadIOPSKey, MaxWriteIOPSKey, MaxReadBPSKey, MaxWriteBPSKey}},
		{name: "one key", params: map[string]string{MaxWriteIOPSKey: "500"}, want: host.IOLimits{WriteIOPS: 500}, keys: []string{MaxWriteIOPSKey}},
		{name: "max gives the key, no limit", params: map[string]string{MaxReadIOPSKey: "max", MaxReadBPSKey: "max"}, keys: []string{MaxReadIOPSKey, MaxReadBPSKey}},
		{name: "binary quantity", params: map[string]string{MaxReadBPSKey: "100Mi"}, want: host.IOLimits{ReadBPS: 100 << 20}, keys: []string{MaxReadBPSKey}},
		{name: "decimal quantity", params: map[string]string{MaxWriteBPSKey: "50M"}, want: host.IOLimits{WriteBPS: 50e6}, keys: []string{MaxWriteBPSKey}},
		{name: "decimal kilo is lower case", params: map[string]string{MaxWriteBPSKey: "8000k"}, want: host.IOLimits{WriteBPS: 8e6}, keys: []string{MaxWriteBPSKey}},
		{name: "a fraction whole in bytes", params: map[string]string{MaxReadBPSKey: "1.5Gi"}, want: host.IOLimits{ReadBPS: 3 << 29}, keys: []string{MaxReadBPSKey}},
		{name: "every suffix", params: map[string]string{MaxReadBPSKey: "7Ei", MaxWriteBPSKey: "9E"}, want: host.IOLimits{ReadBPS: 7 << 60, WriteBPS: 9e18},
			keys: []string{MaxReadBPSKey, MaxWriteBPSKey}},
		{name: "the least limits", params: map[string]string{MaxReadIOPSKey: "10", MaxReadBPSKey: "1Mi", MaxWriteBPSKey: "1048576"},
			want: host.IOLimits{ReadIOPS: 10, ReadBPS: 1 << 20, WriteBPS: 1 << 20}, keys: []string{MaxReadIOPSKey, MaxReadBPSKey, MaxWriteBPSKey}},
		{name: "the greatest IOPS", params: map[string]string{MaxWriteIOPSKey: "4294967294"}, want: host.IOLimits{WriteIOPS: 1<<32 - 2}, keys: []string{MaxWriteIOPSKey}},
		{name: "the greatest bytes", params: map[string]string{MaxWriteBPSKey: "9223372036854775807"}, want: host.IOLimits{WriteBPS: 1<<63 - 1}, keys: []string{MaxWriteBPSKey}},
		{name: "kubernetes' own keys ignored", params: map[string]string{"csi.storage.k8s.io/pvc/name": "c", "csi.storage.k8s.io/pv/name": "pv", MaxReadIOPSKey: "10"},
			want: host.IOLimits{ReadIOPS: 10}, keys: []string{MaxReadIOPSKey}},

		{name: "unknown key", params: map[string]string{"XXX_FakeKey": "XXX_FakeValue"}, err: `unknown mutable parameters: "XXX_FakeKey"`},
		{name: "keys are case-sensitive", params: map[string]string{"MaxReadIOPS": "10"}, err: `"MaxReadIOPS"`},
		{name: "unknown beside known", params: map[string]string{MaxReadIOPSKey: "10", "iops": "5"}, err: `"iops"`},
		{name: "empty value", params: map[string]string{MaxReadIOPSKey: ""}, err: "mutable parameter maxReadIops: empty value"},
		{name: "leading space", params: map[string]string{MaxWriteBPSKey: " 100Mi"}, err: "mutable parameter maxWriteBps: \" 100Mi\" holds whitespace"},
		{name: "trailing newline", params: map[string]string{MaxReadBPSKey: "100\n"}, err: "mutable parameter maxReadBps: \"100\\n\" holds whitespace"},
		{name: "space inside", params: map[string]string{MaxReadIOPSKey: "1 0"}, err: "maxReadIops: \"1 0\" holds whitespace"},
		{name: "zero", params: map[string]string{MaxReadIOPSKey: "0"}, err: "maxReadIops: \"0\" is below 10"},
		{name: "one, which io.max refuses", params: map[string]string{MaxWriteIOPSKey: "1"}, err: "maxWriteIops: \"1\" is below 10"},
		{name: "two IOPS", params: map[string]string{MaxWriteIOPSKey: "2"}, err: "maxWriteIops: \"2\" is below 10"},
		{name: "IOPS just below the least", params: map[string]string{MaxReadIOPSKey: "9"}, err: "maxReadIops: \"9\" is below 10"},
		{name: "one byte", params: map[string]string{MaxReadBPSKey: "1"}, err: "maxReadBps: \"1\" is below 1048576"},
		{name: "two bytes", params: map[string]string{MaxWriteBPSKey: "2"}, err: "maxWriteBps: \"2\" is below 1048576"},
		{name: "bytes just below the least", params: map[string]string{MaxReadBPSKey: "1048575"}, err: "maxReadBps: \"1048575\" is below 1048576"},
		{name: "a decimal megabyte", params: map[string]string{MaxWriteBPSKey: "1M"}, err: "maxWriteBps: \"1M\" is below 1048576"},
		{name: "zero quantity", params: map[string]string{MaxReadBPSKey: "0Mi"}, err: "maxReadBps: \"0Mi\" is below 1048576"},
		{name: "UINT_MAX IOPS, the kernel's none", params: map[string]string{MaxReadIOPSKey: "4294967295"}, err: "maxReadIops: \"4294967295\" is above 4294967294"},
		{name: "IOPS above what the kernel holds", params: map[string]string{MaxReadIOPSKey: "4294967296"}, err: "maxReadIops: \"4294967296\" is above 4294967294"},
		{name: "bytes above a quantity", params: map[string]string{MaxReadBPSKey: "8Ei"}, err: "maxReadBps: \"8Ei\" is above 9223372036854775807"},
		{name: "beyond 64 bits", params: map[string]string{MaxReadBPSKey: "99999999999999999999999"}, err: "is above"},
		{name: "negative", params: map[string]string{MaxReadIOPSKey: "-5"}, err: "maxReadIops: \"-5\": want a whole number"},
		{name: "plus sign", params: map[string]string{MaxReadBPSKey: "+5"}, err: "maxReadBps: \"+5\": want a whole number or a quantity"},
		{name: "IOPS take no suffix", params: map[string]string{MaxReadIOPSKey: "1k"}, err: "maxReadIops: \"1k\": want a whole number"},
		{name: "IOPS take no fraction", params: map[string]string{MaxReadIOPSKey: "2.0"}, err: "maxReadIops: \"2.0\": want a whole number"},
		{name: "a fraction of a byte", params: map[string]string{MaxReadBPSKey: "2.5"}, err: "maxReadBps: \"2.5\" is not a whole number of bytes"},
		{name: "a fraction of a byte after the suffix", params: map[string]string{MaxWriteBPSKey: "1.0001k"}, err: "is not a whole number of bytes"},
		{name: "milli is no rate of bytes", params: map[string]string{MaxReadBPSKey: "500m"}, err: "want a whole number or a quantity"},
		{name: "exponent", params: map[string]string{MaxReadBPSKey: "1e6"}, err: "want a whole number or a quantity"},
		{name: "unknown suffix", params: map[string]string{MaxReadBPSKey: "1MB"}, err: "want a whole number or a quantity"},
		{name: "Max is not max", params: map[string]string{MaxReadIOPSKey: "Max"}, err: "maxReadIops: \"Max\""},
		{name: "unlimited is not max", params: map[string]string{MaxReadIOPSKey: "unlimited"}, err: "maxReadIops"},
		{name: "too long", params: map[string]string{MaxReadBPSKey: strings.Repeat("1", 65)}, err: "too long"},
		// The length is checked first: an over-long value is never
		// echoed, whatever else is wrong with it.
		{name: "too long, with whitespace", params: map[string]string{MaxReadBPSKey: strings.Repeat("1 ", 1000)}, err: "maxReadBps: value of 2000 bytes is too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseIOLimits(tc.params)
			if tc.err != "" {
				e := classified.AsError(err)
				if e == nil || e.Kind != classified.KindInvalidArgument || !strings.Contains(e.Message, tc.err) {
					t.Fatalf("got %v, want INVALID_ARGUMENT with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want none", err)
			}
			if got := p.Apply(host.IOLimits{}); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			// What is accepted can be applied: SetThrottle refuses what
			// Check does, and every publish would wait on it.
			if err := p.Apply(host.IOLimits{}).Check(); err != nil {
				t.Errorf("accepted limits the host refuses: %v", err)
			}
			if got := p.Keys(); !slices.Equal(got, tc.keys) {
				t.Errorf("got keys %q, want %q", got, tc.keys)
			}
		})
	}
}

// TestIOLimitParamsApply owns the merge of a class's IO limits into the
// volume's: a key given sets its limit, NoLimit removes it, and a key not
// given leaves it as it was (CSI: no change for an absent key).
func TestIOLimitParamsApply(t *testing.T) {
	recorded := host.IOLimits{ReadIOPS: 100, WriteIOPS: 200, ReadBPS: 300 << 20, WriteBPS: 400 << 20}
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   host.IOLimits
	}{
		{name: "no keys change nothing", params: nil, want: recorded},
		{name: "only kubernetes' keys change nothing", params: map[string]string{"csi.storage.k8s.io/pv/name": "pv"}, want: recorded},
		{name: "one key set, the others kept", params: map[string]string{MaxWriteIOPSKey: "50"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 50, ReadBPS: 300 << 20, WriteBPS: 400 << 20}},
		{name: "max removes one", params: map[string]string{MaxReadBPSKey: "max"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 200, WriteBPS: 400 << 20}},
		{name: "max everywhere removes all", params: map[string]string{MaxReadIOPSKey: "max", MaxWriteIOPSKey: "max", MaxReadBPSKey: "max", MaxWriteBPSKey: "max"}},
		{name: "the same values change nothing", params: map[string]string{MaxReadIOPSKey: "100", MaxWriteBPSKey: "400Mi"}, want: recorded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseIOLimits(tc.params)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Apply(recorded); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
