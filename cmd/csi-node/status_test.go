package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/volstatus"
)

// TestStatusNamesRestores prints a status with two volumes being restored:
// each has a line after the snapshots, and the volume table follows after
// a blank line as without them.
func TestStatusNamesRestores(t *testing.T) {
	s := Status{Pool: volstatus.Pool{Node: "n", CopyMode: "sparse", Restores: []volstatus.Restore{
		{VolumeID: "r1_n", SnapshotID: "s1_n", SizeBytes: 1 << 30, CopiedBytes: 256 << 20, SourceBytes: 512 << 20},
		{VolumeID: "r2_n", SnapshotID: "s1_n", SizeBytes: 64 << 20, SourceBytes: 512 << 20},
	}}}
	var out bytes.Buffer
	if err := PrintStatus(&out, s, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 9 || !strings.HasPrefix(lines[4], "SNAPSHOTS ") ||
		lines[5] != "RESTORING       r1_n from snapshot s1_n: 256Mi of its 512Mi copied, 1.0Gi promised until it is made" ||
		lines[6] != "RESTORING       r2_n from snapshot s1_n: 0 of its 512Mi copied, 64Mi promised until it is made" ||
		lines[7] != "" || !strings.HasPrefix(lines[8], "VOLUME") {
		t.Errorf("status:\n%s", out.String())
	}
}
