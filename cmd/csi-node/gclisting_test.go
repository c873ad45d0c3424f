package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// A listing as kubectl get pv,volumesnapshotcontents -o json prints it:
// a PersistentVolume and a VolumeSnapshotContent of the driver, and one
// of each of another driver.
const pvAndContent = `{"apiVersion": "v1", "kind": "List", "items": [
	{"kind": "PersistentVolume", "spec": {"csi": {"driver": "converge.csi.dev", "volumeHandle": "v1"}}},
	{"kind": "PersistentVolume", "spec": {"csi": {"driver": "other.csi.dev", "volumeHandle": "v2"}}},
	{"kind": "VolumeSnapshotContent", "spec": {"driver": "converge.csi.dev", "source": {"volumeHandle": "v1"}}, "status": {"snapshotHandle": "s1"}},
	{"kind": "VolumeSnapshotContent", "spec": {"driver": "other.csi.dev"}, "status": {"snapshotHandle": "s2"}}],
	"metadata": {"resourceVersion": ""}}
`

// TestReadListing feeds readListing what kubectl and the shell give it:
// only a whole List followed by kubectl's exit status 0 is read, and
// then the driver's handles alone are kept.
func TestReadListing(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        []string // the IDs; nil with wantErr
		wantErr     string
		contents    int // the snapshot contents named, when not 1
	}{
		{name: "the listing and status 0", input: pvAndContent + "0\n", want: []string{"v1", "s1"}},
		{name: "a pre-provisioned group's content", input: strings.Replace(pvAndContent, `{"kind": "VolumeSnapshotContent", "spec": {"driver": "converge.csi.dev"`,
			`{"kind": "VolumeGroupSnapshotContent", "spec": {"driver": "converge.csi.dev", "source": {"groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g1", "volumeSnapshotHandles": ["m1", "m2"]}}}, "status": {"volumeGroupSnapshotHandle": "g1", "volumeSnapshotInfoList": [{"snapshotHandle": "m1"}, {"snapshotHandle": "m2"}]}},`+
				`{"kind": "VolumeSnapshotContent", "spec": {"driver": "converge.csi.dev"`, 1) + "0\n", want: []string{"v1", "g1", "g1", "m1", "m2", "m1", "m2", "s1"}, contents: 2},
		{name: "nothing", input: "", wantErr: "reading the input as JSON"},
		{name: "kubectl failed and listed nothing", input: "1\n", wantErr: "kubectl exited 1 and listed nothing"},
		{name: "kubectl listed part and failed", input: pvAndContent + "1\n", wantErr: "kubectl exited 1: its listing lacks"},
		{name: "no exit status (the pipeline of old)", input: pvAndContent, wantErr: "without kubectl's exit status"},
		{name: "a listing cut off", input: pvAndContent[:len(pvAndContent)/2] + "\n141\n", wantErr: "reading the input as JSON"},
		{name: "something else after the List", input: pvAndContent + `"ok"`, wantErr: "not kubectl's exit status"},
		{name: "more after the status", input: pvAndContent + "0\n" + pvAndContent + "0\n", wantErr: "more after kubectl's exit status"},
		{name: "not a List", input: `{"kind": "PersistentVolume", "spec": {}}` + "\n0\n", wantErr: `is a "PersistentVolume", not a List`},
		{name: "a List of nothing", input: `{"kind": "List"}` + "\n0\n", wantErr: "not a List with items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := readListing(strings.NewReader(tc.input), "converge.csi.dev")
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got %v, want an error with %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.wantErr == "" && (!slices.Equal(l.ids, tc.want) || l.volumes != 1 || l.snapshots != max(tc.contents, 1)):
				t.Errorf("got IDs %v from %d PVs and %d contents, want %v from 1 and %d", l.ids, l.volumes, l.snapshots, tc.want, max(tc.contents, 1))
			}
		})
	}
}

// TestListingCovers checks what a listing covers: one without a
// PersistentVolume of the driver nothing, unless the operator says the
// cluster has none; one without a VolumeSnapshotContent of the driver the
// volumes alone, unless the operator says the cluster has none; and a word
// of the operator that the listing contradicts is refused.
func TestListingCovers(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		pvs, contents          int
		noPVs, noContents      bool
		wantVolumes, wantSnaps bool
		wantErr                string
	}{
		{name: "both kinds", pvs: 2, contents: 1, wantVolumes: true, wantSnaps: true},
		{name: "an empty listing", wantErr: "names no PersistentVolume of converge.csi.dev"},
		{name: "contents alone", contents: 1, wantErr: "names no PersistentVolume of converge.csi.dev"},
		{name: "PersistentVolumes alone", pvs: 1, wantVolumes: true},
		{name: "PersistentVolumes alone, none in the cluster", pvs: 1, noContents: true, wantVolumes: true, wantSnaps: true},
		{name: "an empty cluster, said so", noPVs: true, noContents: true, wantVolumes: true, wantSnaps: true},
		{name: "no PersistentVolume, said so, with contents", noPVs: true, contents: 1, wantVolumes: true, wantSnaps: true},
		{name: "said no PersistentVolume, but one listed", pvs: 1, noPVs: true, wantErr: "drop the flag"},
		{name: "said no content, but one listed", pvs: 1, contents: 1, noContents: true, wantErr: "drop the flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listing{volumes: tc.pvs, snapshots: tc.contents}
			volumes, snaps, err := l.covers("converge.csi.dev", tc.noPVs, tc.noContents)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || volumes || snaps):
				t.Errorf("got %v, %v, %v; want nothing covered and an error with %q", volumes, snaps, err, tc.wantErr)
			case tc.wantErr == "" && (err != nil || volumes != tc.wantVolumes || snaps != tc.wantSnaps):
				t.Errorf("got volumes %v, snapshots %v, %v; want %v, %v", volumes, snaps, err, tc.wantVolumes, tc.wantSnaps)
			}
		})
	}
}

// TestPipelineIsTheDocumentedOne checks that the listing the refusals name
// is the one docs/operations.md gives whole.
func TestPipelineIsTheDocumentedOne(t *testing.T) {
	docs, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	listing, _, ok := strings.Cut(gcPipeline, " | kubectl exec -i ... -- csi-node gc")
	if !ok || !strings.Contains(string(docs), listing+" | kubectl exec -i ") {
		t.Errorf("docs/operations.md does not feed csi-node gc %q", listing)
	}
}
