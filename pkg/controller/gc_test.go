package controller

import (
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// TestCheckListed checks which listings csi-node gc may go on with: one
// that names something this node holds, or none while the operator says
// the cluster has nothing of this node, or one that would leave nothing
// over; not one that names nothing of this node (another cluster's, whose
// node may have this node's name), nor the operator's word where the
// listing names something here.
func TestCheckListed(t *testing.T) {
	c := &Controller{topology: map[string]string{contract.TopologyKey: "node-a"}}
	held := map[string]bool{"pvc-1_node-a": true}
	snaps := []heldSnapshot{{SnapshotInfo: devices.SnapshotInfo{ID: "snap-1_node-a"}}}
	covers := volstatus.GCRequest{Volumes: true, Snapshots: true}
	word := covers
	word.NodeUnlisted = true
	for _, tc := range []struct {
		name       string
		req        volstatus.GCRequest
		referenced []string
		volumes    map[string]bool
		snapshots  []heldSnapshot
		want       string // "" to go on
	}{
		{name: "names a volume here", req: covers, referenced: []string{"pvc-9_node-b", "pvc-1_node-a"}, volumes: held, snapshots: snaps},
		{name: "names a snapshot here", req: covers, referenced: []string{"snap-1_node-a"}, volumes: held, snapshots: snaps},
		{name: "another cluster's, a node of this name in it", req: covers, referenced: []string{"pvc-2_node-a"}, volumes: held, snapshots: snaps,
			want: "names none of the 1 volumes and 1 snapshots that node node-a holds"},
		{name: "another cluster's, volumes alone covered", req: volstatus.GCRequest{Volumes: true}, referenced: []string{"pvc-2_node-b"}, volumes: held,
			want: "add --node-has-no-pvs"},
		{name: "another cluster's, snapshots alone covered", req: volstatus.GCRequest{Snapshots: true}, referenced: []string{"pvc-2_node-b"}, snapshots: snaps,
			want: "add --node-has-no-pvs"},
		{name: "covers nothing here", req: volstatus.GCRequest{Volumes: true}, referenced: []string{"pvc-2_node-b"}, snapshots: snaps},
		{name: "this node holds nothing", req: covers, referenced: []string{"pvc-2_node-b"}},
		{name: "the operator's word, nothing named here", req: word, referenced: []string{"pvc-2_node-b"}, volumes: held, snapshots: snaps},
		{name: "the operator's word, a volume named here", req: word, referenced: []string{"pvc-1_node-a"}, volumes: held, snapshots: snaps,
			want: "--node-has-no-pvs, but the input names volume pvc-1_node-a, which node node-a holds: nothing is deleted; drop the flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			referenced := map[string]bool{}
			for _, id := range tc.referenced {
				referenced[id] = true
			}
			err := c.checkListed(tc.req, referenced, tc.volumes, tc.snapshots)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want the listing taken", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || classified.AsError(err).Kind != classified.KindFailedPrecondition):
				t.Errorf("got %v, want FailedPrecondition with %q", err, tc.want)
			}
		})
	}
}
