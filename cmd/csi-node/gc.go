package main

import (
	"context"
	"encoding/json"
	"errors"
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
// pipeline feeds it.
func gcCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", driver.DefaultStateDir, "state directory of the running plugin (its status socket is there)")
	driverName := fs.String("driver-name", driver.DefaultDriverName, "CSI driver whose PersistentVolumes and VolumeSnapshotContents the input lists")
	minAge := fs.Duration("min-age", 10*time.Minute, "keep what changed more recently than this (a volume just made may not have its PersistentVolume yet)")
	remove := fs.Bool("delete", false, "delete what nothing references (default: only list it)")
	output := fs.String("o", "table", "output format: table or json")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: kubectl get pv,volumesnapshotcontents -o json | csi-node gc [flags]\n\n"+
			"Lists the volumes and snapshots of this node that no PersistentVolume or\n"+
			"VolumeSnapshotContent of the input references; --delete deletes them.\n"+
			"Never one that is staged, published, being restored or being taken.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *output != "table" && *output != "json" || *minAge < 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	refs, err := readReferences(stdin, *driverName)
	if err != nil {
		fmt.Fprintf(stderr, "csi-node gc: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "csi-node gc: the input references %d volumes and %d snapshots of %s\n", refs.volumes, refs.snapshots, *driverName)
	var orphans []volstatus.Orphan
	req := volstatus.GCRequest{Referenced: refs.ids, MinAge: *minAge, Delete: *remove}
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

// references are the IDs of the driver's volumes and snapshots the input
// lists.
type references struct {
	ids                []string
	volumes, snapshots int
}

// readReferences reads a Kubernetes List (kubectl get -o json) and keeps
// the volume handles of the driver's PersistentVolumes and the snapshot
// handles of its VolumeSnapshotContents. Anything but one whole List is
// refused: a listing cut short would make referenced volumes look left
// over.
func readReferences(r io.Reader, driverName string) (references, error) {
	var list struct {
		Kind  string `json:"kind"`
		Items *[]struct {
			Kind string `json:"kind"`
			Spec struct {
				CSI *struct {
					Driver       string `json:"driver"`
					VolumeHandle string `json:"volumeHandle"`
				} `json:"csi"`
				Driver string `json:"driver"`
				Source struct {
					SnapshotHandle string `json:"snapshotHandle"`
				} `json:"source"`
			} `json:"spec"`
			Status struct {
				SnapshotHandle string `json:"snapshotHandle"`
			} `json:"status"`
		} `json:"items"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&list); err != nil {
		return references{}, fmt.Errorf("reading the input as JSON (kubectl get pv,volumesnapshotcontents -o json): %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return references{}, errors.New("the input holds more than one JSON document: give one List")
	}
	if list.Kind != "List" || list.Items == nil {
		return references{}, fmt.Errorf("the input is a %q, not a List with items (kubectl get pv,volumesnapshotcontents -o json)", list.Kind)
	}
	var refs references
	for _, it := range *list.Items {
		switch it.Kind {
		case "PersistentVolume":
			if it.Spec.CSI != nil && it.Spec.CSI.Driver == driverName && it.Spec.CSI.VolumeHandle != "" {
				refs.ids = append(refs.ids, it.Spec.CSI.VolumeHandle)
				refs.volumes++
			}
		case "VolumeSnapshotContent":
			if it.Spec.Driver != driverName {
				continue
			}
			for _, h := range []string{it.Status.SnapshotHandle, it.Spec.Source.SnapshotHandle} {
				if h != "" {
					refs.ids = append(refs.ids, h)
				}
			}
			refs.snapshots++
		}
	}
	return refs, nil
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
