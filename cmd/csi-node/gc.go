package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/converge-csi/converge/pkg/driver"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// gcCommand runs "csi-node gc": it reads what the cluster references from
// standard input, asks the running plugin which of this node's volumes and
// snapshots are left over, and prints them; with --delete the plugin
// deletes them. csi-node never calls the API server: docs/operations.md's kubectl
// pipeline feeds it (gcPipeline). An input that may not cover every
// volume is refused; one that may not cover every snapshot keeps them all.
func gcCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", driver.DefaultStateDir, "state directory of the running plugin (its status socket is there)")
	driverName := fs.String("driver-name", driver.DefaultDriverName, "CSI driver whose PersistentVolumes and VolumeSnapshotContents the input lists")
	minAge := fs.Duration("min-age", 10*time.Minute, "keep what changed more recently than this (a volume just made may not have its PersistentVolume yet)")
	remove := fs.Bool("delete", false, "delete what nothing references (default: only list it)")
	noPVs := fs.Bool("cluster-has-no-pvs", false, "the cluster has no PersistentVolume of the driver: an input that names none covers the volumes (without it, such an input is refused)")
	noNode := fs.Bool("node-has-no-pvs", false, "no PersistentVolume or VolumeSnapshotContent of the cluster names a volume or snapshot this node holds (its volumes were all released or deleted): an input that names none of them covers this node (without it, such an input is refused while the node holds any: it may list another cluster)")
	noContents := fs.Bool("cluster-has-no-snapshots", false, "the cluster has no VolumeSnapshotContent of the driver (or no snapshot CRDs): an input that names none covers the snapshots (without it, every snapshot is kept)")
	output := fs.String("o", "table", "output format: table or json")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s [flags]\n\n"+
			"Lists the volumes and snapshots of this node that no PersistentVolume or\n"+
			"VolumeSnapshotContent of the input references; --delete deletes them.\n"+
			"Never one that is staged, published, being restored or being taken, nor\n"+
			"anything when kubectl's exit status after the listing is not 0, nor when\n"+
			"the listing names nothing this node holds (another cluster's).\n\n", gcPipeline)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *output != "table" && *output != "json" || *minAge < 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	l, err := readListing(stdin, *driverName)
	if err != nil {
		fmt.Fprintf(stderr, "csi-node gc: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "csi-node gc: the input references %d volumes and %d snapshots of %s\n", l.volumes, l.snapshots, *driverName)
	volumes, snapshots, err := l.covers(*driverName, *noPVs, *noContents)
	if err != nil {
		fmt.Fprintf(stderr, "csi-node gc: %v\n", err)
		return 1
	}
	var orphans []volstatus.Orphan
	req := volstatus.GCRequest{Referenced: l.ids, Volumes: volumes, Snapshots: snapshots, NodeUnlisted: *noNode, MinAge: *minAge, Delete: *remove}
	if err := ask(context.Background(), *stateDir, "", "POST", "/gc", req, &orphans, 10*time.Minute); err != nil {
		fmt.Fprintf(stderr, "csi-node gc: %v\n", err)
		return 1
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(orphans)
		return 0
	}
	printOrphans(stdout, orphans, *remove)
	return 0
}

// printOrphans writes one line per volume or snapshot nothing references.
func printOrphans(w io.Writer, orphans []volstatus.Orphan, removed bool) {
	if len(orphans) == 0 {
		fmt.Fprintln(w, "Nothing on this node is left over.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tID\tPOOL\tSIZE\tCHANGED\tWHAT")
	for _, o := range orphans {
		what := "left over: csi-node gc --delete deletes it"
		switch {
		case o.Kept != "":
			what = "kept: " + o.Kept
		case o.Deleted:
			what = "deleted"
		case removed:
			what = "left over"
		}
		changed := "-"
		if !o.Changed.IsZero() {
			changed = o.Changed.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", o.Kind, o.ID, o.Pool, size(o.Bytes), changed, what)
	}
	tw.Flush()
}
