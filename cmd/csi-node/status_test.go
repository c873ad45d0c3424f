package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/volstatus"
)

// TestStatusNamesRestores prints a status with two pools, two volumes
// being restored in the second: each has a line after that pool's
// snapshots, and the volume table, with each volume's pool, follows after
// a blank line.
func TestStatusNamesRestores(t *testing.T) {
	s := Status{Pools: []volstatus.PoolStatus{{Name: "default", Dir: "/var/lib/converge/volumes", Node: "n", CopyMode: "sparse"},
		{Name: "fast", Dir: "/mnt/nvme", Node: "n", CopyMode: "reflink", Restores: []volstatus.Restore{
			{VolumeID: "r1_n", SnapshotID: "s1_n", SizeBytes: 1 << 30, CopiedBytes: 256 << 20, SourceBytes: 512 << 20},
			{VolumeID: "r2_n", SnapshotID: "s1_n", SizeBytes: 64 << 20, SourceBytes: 512 << 20},
		}}},
		Volumes: []volstatus.VolumeStatus{{ID: "r1_n", Pool: "fast", Phase: volstatus.PhaseSettingUp}}}
	var out bytes.Buffer
	if err := PrintStatus(&out, s, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 14 || !strings.HasPrefix(lines[1], "POOL default    /var/lib/converge/volumes: size") ||
		!strings.HasPrefix(lines[5], "POOL fast       /mnt/nvme: size") || !strings.HasPrefix(lines[8], "  SNAPSHOTS ") ||
		lines[9] != "  RESTORING     r1_n from snapshot s1_n: 256Mi of its 512Mi copied, 1.0Gi promised until it is made" ||
		lines[10] != "  RESTORING     r2_n from snapshot s1_n: 0 of its 512Mi copied, 64Mi promised until it is made" ||
		lines[11] != "" || !strings.HasPrefix(lines[12], "VOLUME  POOL") || !strings.HasPrefix(lines[13], "r1_n    fast") {
		t.Errorf("status:\n%s", out.String())
	}
}

// TestStatusWarnsOfALowGuard prints pools on the kubelet's filesystem: one
// whose guard keeps it above the kubelet's eviction threshold says where it
// is, one whose guard does not says so in capitals, and one past its guard
// says that no volume is made or grown in it; a pool that could not be read
// says why, and nothing of its space.
func TestStatusWarnsOfALowGuard(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool volstatus.PoolStatus
		want []string
		not  []string
	}{
		{name: "elsewhere", pool: volstatus.PoolStatus{Name: "fast", GuardBytes: 5 << 20},
			want: []string{"(guard 5Mi), "}, not: []string{"kubelet", "NEARLY FULL"}},
		{name: "kubelet's, default guard", pool: volstatus.PoolStatus{Name: "default", GuardBytes: 20 << 30, KubeletFilesystem: true},
			want: []string{"(guard 20.0Gi), ", ", on the kubelet's filesystem"}, not: []string{"GUARD BELOW"}},
		{name: "kubelet's, low guard", pool: volstatus.PoolStatus{Name: "default", GuardBytes: 5 << 30, KubeletFilesystem: true, GuardBelowKubeletEviction: true},
			want: []string{"on the kubelet's filesystem GUARD BELOW THE KUBELET'S EVICTION THRESHOLD (15%)"}},
		{name: "past its guard", pool: volstatus.PoolStatus{Name: "default", FreeBytes: 1 << 30, GuardBytes: 5 << 30, NearlyFull: true},
			want: []string{"NEARLY FULL: no volume is created or grown"}},
		{name: "unreadable", pool: volstatus.PoolStatus{Name: "fast", Dir: "/mnt/nvme", Error: "statfs /mnt/nvme: input/output error"},
			want: []string{"POOL fast       /mnt/nvme: UNREADABLE: statfs /mnt/nvme: input/output error"}, not: []string{"size 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printPool(&out, tc.pool)
			line, _, _ := strings.Cut(out.String(), "\n")
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("got %q, want it to say %q", line, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(line, n) {
					t.Errorf("got %q, want no %q", line, n)
				}
			}
		})
	}
}

// TestStatusFailsOnAnUnreadablePool: the status command's error, which
// makes it exit 1 after printing, names the pools that could not be read,
// and there is none when every pool was.
func TestStatusFailsOnAnUnreadablePool(t *testing.T) {
	ok := volstatus.PoolStatus{Name: "default"}
	bad := volstatus.PoolStatus{Name: "fast", Error: "statfs: input/output error"}
	if err := unreadable([]volstatus.PoolStatus{ok}); err != nil {
		t.Errorf("every pool read: got %v, want no error", err)
	}
	if err := unreadable([]volstatus.PoolStatus{ok, bad}); err == nil || !strings.Contains(err.Error(), "fast") || strings.Contains(err.Error(), "default") {
		t.Errorf("pool fast unreadable: got %v, want an error naming fast alone", err)
	}
}
