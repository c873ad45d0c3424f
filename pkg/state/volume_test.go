package state

import "testing"

// TestWrittenAs owns what a snapshot records of how its volume's data was
// written: block wins over everything (a workload may have written the
// device raw), mount only where CreateVolume made the volume for a
// filesystem, or, for a record older than Access, where the plugin itself
// formatted or mounted a filesystem; what the plugin cannot vouch for is
// block.
func TestWrittenAs(t *testing.T) {
	staged := func(a AccessType) *Stage { return &Stage{Path: "/s", Access: a} }
	for _, tc := range []struct {
		name string
		v    Volume
		want AccessType
	}{
		{name: "made for a filesystem", v: Volume{Access: AccessMount}, want: AccessMount},
		{name: "made for a filesystem, staged so", v: Volume{Access: AccessMount, Stage: staged(AccessMount), Formatted: "ext4"}, want: AccessMount},
		{name: "made for a raw block device", v: Volume{Access: AccessBlock}, want: AccessBlock},
		{name: "made raw, formatted since", v: Volume{Access: AccessBlock, Formatted: "ext4"}, want: AccessBlock},
		{name: "old record, staged raw now", v: Volume{Stage: staged(AccessBlock)}, want: AccessBlock},
		{name: "old record, formatted, staged raw now", v: Volume{Formatted: "ext4", Stage: staged(AccessBlock)}, want: AccessBlock},
		{name: "made for a filesystem, staged raw by an old plugin", v: Volume{Access: AccessMount, Stage: staged(AccessBlock)}, want: AccessBlock},
		{name: "old record, formatted", v: Volume{Formatted: "xfs"}, want: AccessMount},
		{name: "old record, never formatted", v: Volume{}, want: AccessBlock},
		{name: "old record, never formatted, staged as a filesystem now", v: Volume{Stage: staged(AccessMount)}, want: AccessBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.v.WrittenAs(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
