package integration

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/test/testenv"
)

// TestStatusAndMetrics reads the running plugin's status with
// "csi-node status" (a table and JSON), and its /metrics, /healthz and
// /readyz, while a volume is staged and published and has a snapshot.
func TestStatusAndMetrics(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	volStatus, staging, target := upPublished(t, p, "vol-status")
	snap := snapshotOf(t, p, "snap-status", volStatus)

	out, err := exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir).CombinedOutput()
	must(t, "csi-node status", err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 8 || !strings.HasPrefix(lines[0], "NODE            test-node: ") || !strings.HasPrefix(lines[1], "POOL default    "+p.DataDir+": size ") ||
		!strings.HasPrefix(lines[2], "  PROMISED      thick 64Mi (0 not yet allocated), thin 0 (0 written and not shared, ratio 1)") ||
		!strings.HasPrefix(lines[3], "  AVAILABLE     thick ") ||
		!strings.HasPrefix(lines[4], "  SNAPSHOTS     1, allocating ") || !strings.HasSuffix(lines[4], "(copied by sparse), 0 promised to those being taken") ||
		!strings.HasPrefix(lines[6], "VOLUME") ||
		!strings.Contains(lines[7], "vol-status") || !strings.Contains(lines[7], "default") || !strings.Contains(lines[7], "Ready") || !strings.Contains(lines[7], "thick") ||
		!strings.Contains(lines[7], "1/1") || !strings.Contains(lines[7], "64Mi") {
		t.Errorf("status table:\n%s", out)
	}
	out, err = exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir, "-o", "json").CombinedOutput()
	must(t, "csi-node status -o json", err)
	var st struct {
		Pools []struct {
			Name               string `json:"name"`
			Node               string `json:"node"`
			SizeBytes          int64  `json:"sizeBytes"`
			ThickPromisedBytes int64  `json:"thickPromisedBytes"`
			Snapshots          int    `json:"snapshots"`
			CopyMode           string `json:"copyMode"`
		} `json:"pools"`
		Volumes []struct {
			ID               string `json:"id"`
			Phase            string `json:"phase"`
			StagingPath      string `json:"stagingPath"`
			PublishesDesired int    `json:"publishesDesired"`
			PublishesActual  int    `json:"publishesActual"`
		} `json:"volumes"`
	}
	must(t, "decode", json.Unmarshal(out, &st))
	vols := st.Volumes
	if len(st.Pools) != 1 || st.Pools[0].Name != "default" || st.Pools[0].Node != "test-node" || st.Pools[0].SizeBytes == 0 ||
		st.Pools[0].ThickPromisedBytes != 64<<20 || st.Pools[0].Snapshots != 1 || st.Pools[0].CopyMode != "sparse" {
		t.Errorf("status JSON pools: got %+v, want the default pool of the node, its size, 64 MiB promised and one snapshot copied sparse", st.Pools)
	}
	if len(vols) != 1 || vols[0].ID != volStatus || vols[0].Phase != "Ready" || vols[0].StagingPath != staging || vols[0].PublishesActual != 1 {
		t.Errorf("status JSON: got %+v", vols)
	}

	if code, _ := p.StatusGet("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d", code)
	}
	if code, _ := p.StatusGet("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	code, metrics := p.StatusGet("/metrics")
	for _, want := range []string{
		`converge_operation_duration_seconds_count{operation="stage",result="ok"} 1`,
		`converge_operation_duration_seconds_count{operation="publish",result="ok"} 1`,
		`converge_intents{kind="publish",state="actual"} 1`,
		`converge_volumes{phase="Ready"} 1`,
		`converge_rpc_duration_seconds_count{code="OK",method="/csi.v1.Node/NodeStageVolume"}`,
		`converge_reconcile_pass_duration_seconds_count`,
		`converge_data_directory_bytes{kind="promised_thick",pool="default"} 6.7108864e+07`,
		`converge_data_directory_bytes{kind="promised_thin",pool="default"} 0`,
		`converge_data_directory_nearly_full{pool="default"} 0`,
		`converge_operation_duration_seconds_count{operation="take snapshot",result="ok"} 1`,
		`converge_snapshot_freeze_duration_seconds_count 1`,
		`converge_snapshots{pool="default"} 1`,
	} {
		if code != http.StatusOK || !strings.Contains(metrics, want) {
			t.Errorf("/metrics (%d) lacks %s", code, want)
		}
	}
	_, err = p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	must(t, "DeleteSnapshot", err)
	unpublish(t, p, volStatus, target)
	unstage(t, p, volStatus, staging)

	p.Stop()
	if out, err := exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir).CombinedOutput(); err == nil || !strings.Contains(string(out), "is it running") {
		t.Errorf("status of a stopped plugin: %v, %s", err, out)
	}
}

// TestStatusStaysOnTheNode checks that the TCP address, which deploy/ opens
// on the pod network for the scraper and the probes, serves /metrics,
// /healthz and /readyz but not /status (volume IDs, paths, error text):
// those stay on the root-only status socket unless --http-status opens
// them there too.
func TestStatusStaysOnTheNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  []string
		status int // what /status answers over TCP
	}{
		{name: "default", status: http.StatusNotFound},
		{name: "http-status", flags: []string{"--http-status"}, status: http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			must(t, "a free port", err)
			addr := l.Addr().String()
			l.Close()
			p := testenv.New(t, append([]string{"--http-address=" + addr}, tc.flags...)...)
			p.Start()
			vol, staging, target := upPublished(t, p, "vol-tcp-"+tc.name)
			defer unstage(t, p, vol, staging)
			defer unpublish(t, p, vol, target)

			get := func(path string) (int, string) {
				resp, err := http.Get("http://" + addr + path)
				must(t, "GET "+path+" over TCP", err)
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				must(t, "reading "+path, err)
				return resp.StatusCode, string(b)
			}
			for _, path := range []string{"/metrics", "/healthz", "/livez", "/readyz"} {
				if code, _ := get(path); code != http.StatusOK {
					t.Errorf("GET %s over TCP: got %d, want 200", path, code)
				}
			}
			for _, path := range []string{"/status", "/status/pools", "/status/pool"} {
				code, body := get(path)
				if code != tc.status {
					t.Errorf("GET %s over TCP: got %d, want %d", path, code, tc.status)
				}
				if tc.status != http.StatusOK && (strings.Contains(body, vol) || strings.Contains(body, p.DataDir) || !strings.Contains(body, "--http-status")) {
					t.Errorf("GET %s over TCP names the volume or the pool, or not where the status is: %s", path, body)
				}
			}
			// The socket serves the status whatever the flag, and the
			// client reads it there.
			if code, body := p.StatusGet("/status"); code != http.StatusOK || !strings.Contains(body, vol) {
				t.Errorf("GET /status on the socket: %d %s", code, body)
			}
			out, err := exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir).CombinedOutput()
			if err != nil || !strings.Contains(string(out), vol) {
				t.Errorf("csi-node status: %v\n%s", err, out)
			}
		})
	}
}
