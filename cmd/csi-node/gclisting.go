package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// gcPipeline is how csi-node gc is fed (docs/operations.md has it whole):
// the listing, then kubectl's exit status, which alone tells a whole
// listing from one kubectl could not finish. kubectl prints a List of
// whatever it could list and fails for the rest (a forbidden kind, a 5xx,
// an expired token), and nothing after the pipe sees its exit status:
// csi-node gc reads it from its input.
// It lists VolumeSnapshotContents and VolumeGroupSnapshotContents only
// where their CRDs are installed.
const gcPipeline = `{ kubectl get pv$(kubectl get crd volumesnapshotcontents.snapshot.storage.k8s.io >/dev/null 2>&1 && echo ,volumesnapshotcontents)$(kubectl get crd volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io >/dev/null 2>&1 && echo ,volumegroupsnapshotcontents) -o json; echo $?; } | kubectl exec -i ... -- csi-node gc`

// listing is what the input says the cluster references: the IDs of the
// driver's volumes and snapshots, and how many PersistentVolumes and
// VolumeSnapshotContents of the driver named them.
type listing struct {
	ids                []string
	volumes, snapshots int
}

// readListing reads a Kubernetes List (kubectl get -o json) followed by
// kubectl's exit status, and keeps the volume handles of the driver's
// PersistentVolumes and the snapshot handles of its
// VolumeSnapshotContents. Anything but one whole List followed by the
// status 0 is refused: a listing cut short would make referenced volumes
// look left over.
func readListing(r io.Reader, driverName string) (listing, error) {
	dec := json.NewDecoder(r)
	list, err := decodeList(dec)
	if err != nil {
		return listing{}, err
	}
	if err := readExitStatus(dec); err != nil {
		return listing{}, err
	}
	return list.listing(driverName), nil
}

// kubeList is what gc reads of a List of PersistentVolumes and
// VolumeSnapshotContents: each item's kind, driver and handles.
type kubeList struct {
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
				SnapshotHandle       string `json:"snapshotHandle"`
				GroupSnapshotHandles *struct {
					Group     string   `json:"volumeGroupSnapshotHandle"`
					Snapshots []string `json:"volumeSnapshotHandles"`
				} `json:"groupSnapshotHandles"`
			} `json:"source"`
		} `json:"spec"`
		Status struct {
			SnapshotHandle string `json:"snapshotHandle"`
			GroupHandle    string `json:"volumeGroupSnapshotHandle"`
			Members        []struct {
				SnapshotHandle string `json:"snapshotHandle"`
			} `json:"volumeSnapshotInfoList"`
		} `json:"status"`
	} `json:"items"`
}

// decodeList decides whether the input begins with a List with items: a
// bare number there is kubectl's exit status after it listed nothing, and
// anything else is not a listing.
func decodeList(dec *json.Decoder) (kubeList, error) {
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		return kubeList{}, fmt.Errorf("reading the input as JSON: %v: nothing is deleted; feed it the whole listing and kubectl's exit status: %s (docs/operations.md)", err, gcPipeline)
	}
	if code, err := strconv.Atoi(string(first)); err == nil {
		return kubeList{}, fmt.Errorf("kubectl exited %d and listed nothing (its error is above): nothing is deleted. "+
			"Where the snapshot CRDs are not installed, kubectl knows no volumesnapshotcontents: list pv alone, { kubectl get pv -o json; echo $?; }", code)
	}
	var list kubeList
	if err := json.Unmarshal(first, &list); err != nil || list.Kind != "List" || list.Items == nil {
		return kubeList{}, fmt.Errorf("the input is a %q, not a List with items (kubectl get pv,volumesnapshotcontents -o json)", list.Kind)
	}
	return list, nil
}

// readExitStatus decides whether the List read before it is whole: it
// must be followed by kubectl's exit status 0 and by nothing else, as
// kubectl prints what it could list even when it fails for the rest.
func readExitStatus(dec *json.Decoder) error {
	var status json.RawMessage
	switch err := dec.Decode(&status); {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("the input ends after the List without kubectl's exit status, so a listing kubectl could not finish would look whole: nothing is deleted. Feed it %s (docs/operations.md)", gcPipeline)
	case err != nil:
		return fmt.Errorf("reading kubectl's exit status after the List: %v; feed it %s", err, gcPipeline)
	}
	code, err := strconv.Atoi(string(status))
	if err != nil {
		return fmt.Errorf("after the List the input holds %.40s, not kubectl's exit status: feed it %s", status, gcPipeline)
	}
	if code != 0 {
		return fmt.Errorf("kubectl exited %d: its listing lacks what it could not list (its error is above), so nothing is deleted; run again once kubectl lists everything", code)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the input holds more after kubectl's exit status: give one List and one exit status")
	}
	return nil
}

// listing keeps the items of driverName: the volume handle of each of
// its PersistentVolumes, the snapshot handles of each of its
// VolumeSnapshotContents (its status's, and its spec's where it was
// pre-provisioned), and the group's and members' handles of each of its
// VolumeGroupSnapshotContents (a pre-provisioned group has no member
// VolumeSnapshotContent of its own). Items of other drivers and kinds are
// skipped.
func (list kubeList) listing(driverName string) listing {
	var l listing
	for _, it := range *list.Items {
		switch it.Kind {
		case "PersistentVolume":
			if it.Spec.CSI != nil && it.Spec.CSI.Driver == driverName && it.Spec.CSI.VolumeHandle != "" {
				l.ids = append(l.ids, it.Spec.CSI.VolumeHandle)
				l.volumes++
			}
		case "VolumeSnapshotContent":
			if it.Spec.Driver != driverName {
				continue
			}
			for _, h := range []string{it.Status.SnapshotHandle, it.Spec.Source.SnapshotHandle} {
				if h != "" {
					l.ids = append(l.ids, h)
				}
			}
			l.snapshots++
		case "VolumeGroupSnapshotContent":
			if it.Spec.Driver != driverName {
				continue
			}
			hs := []string{it.Status.GroupHandle}
			if g := it.Spec.Source.GroupSnapshotHandles; g != nil {
				hs = append(append(hs, g.Group), g.Snapshots...)
			}
			for _, m := range it.Status.Members {
				hs = append(hs, m.SnapshotHandle)
			}
			for _, h := range hs {
				if h != "" {
					l.ids = append(l.ids, h)
				}
			}
			l.snapshots++
		}
	}
	return l
}

// covers says which kinds the listing covers, taking the operator's word
// (noPVs, noContents) where a kind has nothing to show for itself: a
// listing that names no PersistentVolume of the driver is refused, as it
// cannot tell an empty cluster from a listing that missed them; one that
// names no VolumeSnapshotContent covers volumes alone. A word the listing
// contradicts is refused too.
func (l listing) covers(driverName string, noPVs, noContents bool) (volumes, snapshots bool, err error) {
	switch {
	case noPVs && l.volumes > 0:
		return false, false, fmt.Errorf("--cluster-has-no-pvs, but the input names %d PersistentVolumes of %s: drop the flag", l.volumes, driverName)
	case noContents && l.snapshots > 0:
		return false, false, fmt.Errorf("--cluster-has-no-snapshots, but the input names %d VolumeSnapshotContents of %s: drop the flag", l.snapshots, driverName)
	case l.volumes == 0 && !noPVs:
		return false, false, fmt.Errorf("the input names no PersistentVolume of %s, so it cannot tell a volume nothing references from one whose PersistentVolume was not listed: nothing is deleted. "+
			"Check that kubectl lists the PersistentVolumes of the right cluster (kubectl get pv); if that cluster has no PersistentVolume of %s, add --cluster-has-no-pvs", driverName, driverName)
	}
	return true, l.snapshots > 0 || noContents, nil
}
