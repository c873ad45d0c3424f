package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/driver"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/loops"
)

// TestGC runs "csi-node gc" against the running plugin with a listing of
// the cluster's PersistentVolumes and kubectl's exit status, as
// docs/operations.md's pipeline feeds it, on a cluster without
// VolumeSnapshotContents (--cluster-has-no-snapshots): a dry run lists what
// nothing references and deletes nothing; --delete deletes it through
// DeleteVolume's and DeleteSnapshot's own paths; what is referenced,
// staged, or changed within --min-age stays, each with the reason. Input
// that is not one whole List and the status 0 deletes nothing, and so does
// a request to the plugin that does not say the listing covers volumes
// and snapshots.
func TestGC(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, "a free port", err)
	addr := l.Addr().String()
	l.Close()
	p := testenv.New(t, "--http-address="+addr)
	p.Start()
	ref := create(t, p, "gc-ref")
	old := create(t, p, "gc-old")
	young := create(t, p, "gc-young")
	staged, staging, target := upPublished(t, p, "gc-staged")
	snap := snapshotOf(t, p, "gc-snap", ref).GetSnapshotId()
	twoHoursAgo := time.Now().Add(-2 * time.Hour)
	for _, id := range []string{ref, old, staged} {
		must(t, "aging "+id, os.Chtimes(filepath.Join(p.DataDir, id+".img"), twoHoursAgo, twoHoursAgo))
	}
	// The listing references ref; a volume of another driver with old's
	// handle references nothing of converge's.
	listing := `{"apiVersion": "v1", "kind": "List", "items": [
		{"kind": "PersistentVolume", "spec": {"csi": {"driver": "converge.csi.dev", "volumeHandle": "` + ref + `"}}},
		{"kind": "PersistentVolume", "spec": {"csi": {"driver": "other.csi.dev", "volumeHandle": "` + old + `"}}},
		{"kind": "PersistentVolume", "spec": {"hostPath": {"path": "/x"}}}]}`
	listed := listing + "\n0\n"
	gc := func(input string, args ...string) (string, error) {
		cmd := exec.Command(testenv.Binary(t), append([]string{"gc", "--state-dir", p.StateDir, "--cluster-has-no-snapshots"}, args...)...)
		cmd.Stdin = strings.NewReader(input)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	exists := func(id string) bool {
		_, err := os.Stat(filepath.Join(p.DataDir, id+".img"))
		return err == nil
	}
	line := func(out, id string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, " "+id+" ") {
				return l
			}
		}
		return ""
	}

	// gc deletes: it is served on the status socket alone, which root
	// alone may open, never on the TCP address of /metrics.
	resp, err := http.Post("http://"+addr+"/gc", "application/json", strings.NewReader(`{"referenced": [], "minAge": 0, "delete": true}`))
	must(t, "POST /gc over TCP", err)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || !exists(old) {
		t.Fatalf("POST /gc over TCP: %s; old there: %v", resp.Status, exists(old))
	}

	out, err := gc(listed, "--min-age=1h")
	must(t, "csi-node gc (dry run)", err)
	t.Logf("csi-node gc --min-age=1h:\n%s", out)
	for id, want := range map[string]string{old: "left over: csi-node gc --delete", young: "kept: changed ", staged: "kept: staged or published", snap: "kept: taken "} {
		if l := line(out, id); !strings.Contains(l, want) {
			t.Errorf("dry run, %s: %q, want %q", id, l, want)
		}
	}
	if l := line(out, ref); l != "" || !strings.Contains(out, "references 1 volumes and 0 snapshots") {
		t.Errorf("dry run: the referenced volume is listed (%q), or the count is wrong:\n%s", l, out)
	}
	if !exists(old) || !exists(young) {
		t.Fatal("a dry run deleted an image")
	}

	out, err = gc(listed, "--min-age=1h", "--delete")
	must(t, "csi-node gc --delete", err)
	t.Logf("csi-node gc --min-age=1h --delete:\n%s", out)
	if l := line(out, old); !strings.Contains(l, "deleted") || exists(old) {
		t.Errorf("--delete, %s: %q; image there: %v", old, l, exists(old))
	}
	for _, id := range []string{ref, young, staged} {
		if !exists(id) {
			t.Errorf("--delete --min-age=1h deleted %s", id)
		}
	}

	out, err = gc(listed, "--min-age=0", "--delete", "-o", "json")
	must(t, "csi-node gc --min-age=0 --delete -o json", err)
	var orphans []struct {
		Kind, ID, Kept string
		Deleted        bool
	}
	must(t, "decode", json.Unmarshal([]byte(out[strings.Index(out, "["):]), &orphans))
	got := map[string]string{}
	for _, o := range orphans {
		got[o.Kind+" "+o.ID] = map[bool]string{true: "deleted", false: "kept: " + o.Kept}[o.Deleted]
	}
	want := map[string]string{"volume " + young: "deleted", "snapshot " + snap: "deleted", "volume " + staged: "kept: staged or published on this node"}
	if len(got) != len(want) {
		t.Errorf("--min-age=0 --delete: %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("--min-age=0 --delete, %s: %q, want %q", k, got[k], v)
		}
	}
	if !exists(ref) || !exists(staged) || exists(young) {
		t.Errorf("after --min-age=0 --delete: ref %v, staged %v (want both), young %v (want gone)", exists(ref), exists(staged), exists(young))
	}

	// Anything but one whole List and the status 0 is refused, and
	// nothing goes.
	for name, input := range map[string]string{
		"nothing":              "",
		"a listing cut off":    listing[:len(listing)/2] + "\n0\n",
		"not a List":           `{"kind": "PersistentVolume", "spec": {}}` + "\n0\n",
		"a List of nothing":    `{"kind": "List"}` + "\n0\n",
		"two documents":        listed + listed,
		"no exit status":       listing,
		"kubectl failed":       listing + "\n1\n",
		"an empty List":        `{"kind": "List", "items": []}` + "\n0\n",
		"another driver's PVs": `{"kind": "List", "items": [{"kind": "PersistentVolume", "spec": {"csi": {"driver": "other.csi.dev", "volumeHandle": "` + ref + `"}}}]}` + "\n0\n",
	} {
		if out, err := gc(input, "--min-age=0", "--delete"); err == nil {
			t.Errorf("%s: accepted:\n%s", name, out)
		}
	}
	if !exists(ref) || !exists(staged) {
		t.Error("a refused input deleted a volume")
	}
	// A listing of another cluster, whose PersistentVolumes of the driver
	// name none of this node's volumes (one names a node of this name),
	// is refused whole, dry run or not, saying what to do. The operator's
	// word that the cluster has nothing of this node is refused where the
	// listing names something here.
	other := `{"kind": "List", "items": [{"kind": "PersistentVolume", "spec": {"csi": {"driver": "converge.csi.dev", "volumeHandle": "pvc-other_` + testenv.NodeID + `"}}}]}` + "\n0\n"
	for _, args := range [][]string{{"--min-age=0", "--delete"}, {"--min-age=0"}} {
		out, err := gc(other, args...)
		if err == nil || !strings.Contains(out, "names none of the 2 volumes and 0 snapshots that node "+testenv.NodeID+" holds") || !strings.Contains(out, "add --node-has-no-pvs") {
			t.Errorf("another cluster's listing, %v: %v, want it refused, saying to add --node-has-no-pvs if the cluster has nothing of this node:\n%s", args, err, out)
		}
	}
	if out, err := gc(listed, "--min-age=0", "--delete", "--node-has-no-pvs"); err == nil || !strings.Contains(out, "names volume "+ref+", which node "+testenv.NodeID+" holds") || !strings.Contains(out, "drop the flag") {
		t.Errorf("--node-has-no-pvs with a listing that names %s: %v, want it refused:\n%s", ref, err, out)
	}
	if !exists(ref) || !exists(staged) {
		t.Error("a refused listing deleted a volume")
	}

	// The plugin itself deletes no kind the request does not say the
	// listing covers: the zero request covers none.
	for _, body := range []string{`{"referenced": [], "minAge": 0, "delete": true}`, `{"referenced": ["` + ref + `"], "minAge": 0, "delete": true, "snapshots": true}`} {
		var orphans []struct{ ID, Kept string }
		must(t, "POST /gc "+body, postGC(p, body, &orphans))
		i := slices.IndexFunc(orphans, func(o struct{ ID, Kept string }) bool { return o.ID == staged })
		if i < 0 || !strings.Contains(orphans[i].Kept, "names no PersistentVolume") {
			t.Errorf("POST /gc %s: %+v, want %s kept as the input names no PersistentVolume", body, orphans, staged)
		}
	}
	if !exists(ref) || !exists(staged) {
		t.Error("a request that covers no volume deleted one")
	}
	// The plugin refuses a request that covers volumes and names none of
	// this node's, as csi-node gc says.
	if err := postGC(p, `{"referenced": ["elsewhere"], "volumes": true, "minAge": 0, "delete": true}`, &[]struct{}{}); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("POST /gc naming nothing of this node: %v, want 409 Conflict", err)
	}

	// Unstaged, the volume nothing references goes too.
	unpublish(t, p, staged, target)
	unstage(t, p, staged, staging)
	out, err = gc(listed, "--min-age=0", "--delete")
	must(t, "csi-node gc --delete after the unstage", err)
	if l := line(out, staged); !strings.Contains(l, "deleted") || exists(staged) || !exists(ref) {
		t.Errorf("after the unstage, %s: %q; ref there: %v\n%s", staged, l, exists(ref), out)
	}

	// With the operator's word that the cluster names nothing of this
	// node, a listing without its volumes deletes them.
	out, err = gc(other, "--min-age=0", "--delete", "--node-has-no-pvs")
	must(t, "csi-node gc --delete --node-has-no-pvs", err)
	if l := line(out, ref); !strings.Contains(l, "deleted") || exists(ref) {
		t.Errorf("--node-has-no-pvs, %s: %q; image there: %v\n%s", ref, l, exists(ref), out)
	}
}

// postGC posts body to the plugin's POST /gc on its status socket and
// decodes the answer into out.
func postGC(p *testenv.Plugin, body string, out any) error {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", driver.StatusSocket(p.StateDir))
	}}}
	resp, err := client.Post("http://converge/gc", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// TestGCStaticRecordMinAge unstages a static volume, whose record, without
// an image, keeps the device's identity and the format's provenance:
// csi-node gc counts its age from the record's last change, so a listing
// without its PersistentVolume deletes it only past --min-age.
func TestGCStaticRecordMinAge(t *testing.T) {
	p := testenv.New(t)
	byID := mkdir(t, filepath.Join(p.Dir, "by-id"))
	p.Args = append(p.Args, "--allowed-device-prefix", byID)
	p.Start()
	disksDir := mkdir(t, filepath.Join(p.Dir, "disks"))
	img := filepath.Join(disksDir, "a.img")
	must(t, "image", os.WriteFile(img, nil, 0o600))
	must(t, "size", os.Truncate(img, 64<<20))
	disk, err := devices.AttachLoop(img, true)
	must(t, "attach", err)
	t.Cleanup(func() {
		p.Stop()
		loops.Release(disk, disksDir)
	})
	link := filepath.Join(byID, "disk-1")
	must(t, "symlink", os.Symlink(disk, link))
	staging := mkdir(t, filepath.Join(p.Root, "staging-static"))
	_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "static-gc", StagingTargetPath: staging, VolumeCapability: rwo,
		VolumeContext: map[string]string{"converge.csi.dev/device": link}})
	must(t, "stage", err)
	unstage(t, p, "static-gc", staging)

	// The cluster's one PersistentVolume of the driver is another node's,
	// as the operator says (--node-has-no-pvs).
	listed := `{"kind": "List", "items": [{"kind": "PersistentVolume", "spec": {"csi": {"driver": "converge.csi.dev", "volumeHandle": "elsewhere"}}}]}` + "\n0\n"
	gc := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(testenv.Binary(t), append([]string{"gc", "--state-dir", p.StateDir, "--delete", "--node-has-no-pvs"}, args...)...)
		cmd.Stdin = strings.NewReader(listed)
		out, err := cmd.CombinedOutput()
		must(t, "csi-node gc "+strings.Join(args, " ")+": "+string(out), err)
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "volume ") && strings.Contains(l, " static-gc ") {
				return l
			}
		}
		t.Fatalf("csi-node gc %s does not list static-gc:\n%s", strings.Join(args, " "), out)
		return ""
	}
	if l := gc("--min-age=1h"); !strings.Contains(l, "kept: changed ") {
		t.Errorf("--min-age=1h: %q, want the record kept as changed within the least age", l)
	}
	if l := gc("--min-age=0"); !strings.HasSuffix(l, "deleted") {
		t.Errorf("--min-age=0: %q, want the record deleted", l)
	}
}
