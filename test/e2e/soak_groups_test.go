package e2e

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/soak"
)

// The soak's group snapshots: a group is two filesystem claims on one
// node, labelled soak-group=<its name>, written in turn by one pod (named
// after the group), each claim the owner of the records written to it
// (soak.CheckGroupCut says how a group's snapshot is then consistent). A
// group-snapshot event takes a VolumeGroupSnapshot of a group and restores
// its members to new claims, which the soak then keeps as any other volume
// (their lineage the members' as they stood before the group was asked
// for), after it has checked that the restores hold one cut of the
// writing.

// groupMemberSize is what each member of a group, and each of its
// restores, asks for: an xfs's least.
const groupMemberSize = "320Mi"

// soakGroupLabel is the label that selects a group's claims.
const soakGroupLabel = "soak-group"

// soakGroup is one of the soak's groups.
type soakGroup struct {
	name    string
	class   string
	node    string
	members []string // its claims, in the order its pod writes them
}

// path is where the group's pod finds the log of member i.
func (g soakGroup) path(i int) string { return "/" + string(rune('a'+i)) + "/log" }

// makeGroup makes a group of two claims of class on node, and its writer.
func (s *soakRun) makeGroup(class, node string) error {
	g := soakGroup{name: s.next("soak-g"), class: class, node: node}
	g.members = []string{g.name + "-a", g.name + "-b"}
	mode := fs
	for _, m := range g.members {
		if err := s.history.New(m); err != nil {
			return err
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: m, Labels: map[string]string{"app": "soak", soakGroupLabel: g.name}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
				StorageClassName: ptr.To(class),
				VolumeMode:       &mode,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(groupMemberSize)}},
			},
		}
		if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Create(s.ctx, pvc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create claim %s: %w", m, err)
		}
	}
	spec := podSpecOf(podSpec{name: g.name, claims: g.members, node: node})
	spec.Containers[0].Name = "w"
	spec.Containers[0].Image, spec.Containers[0].ImagePullPolicy = soakImage, corev1.PullNever
	spec.Containers[0].Command = []string{"/" + soak.WriterName, "write"}
	for i, m := range g.members {
		spec.Containers[0].VolumeMounts[i].MountPath = "/" + string(rune('a'+i))
		spec.Containers[0].Command = append(spec.Containers[0].Command, m+"="+g.path(i))
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: g.name, Labels: map[string]string{"app": "soak"}}, Spec: spec}
	if _, err := c.client.CoreV1().Pods(ns).Create(s.ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", g.name, err)
	}
	s.mu.Lock()
	s.groups = append(s.groups, g)
	s.mu.Unlock()
	return nil
}

// groupSnapshot takes a VolumeGroupSnapshot of a group, restores its
// members, checks that the restores hold one cut of the group's writing,
// and deletes the group snapshot.
func (s *soakRun) groupSnapshot(draw int) error {
	s.mu.Lock()
	if len(s.groups) == 0 {
		s.mu.Unlock()
		return nil
	}
	g := s.groups[draw%len(s.groups)]
	s.mu.Unlock()
	need := resource.MustParse(groupMemberSize)
	need.Set(need.Value() * int64(len(g.members)))
	if err := s.makeRoom(draw, g.class, need, g.node); err != nil {
		return err
	}
	var lineages [][]soak.Expect
	for _, m := range g.members {
		l, err := s.history.Lineage(m)
		if err != nil {
			return err
		}
		lineages = append(lineages, l)
	}
	name := s.next(g.name + "-gs")
	members, err := s.takeGroupSnapshot(name, g)
	if err != nil {
		return err
	}
	defer c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns).Delete(s.ctx, name, metav1.DeleteOptions{})
	var restores []soakVolume
	defer s.release(&restores)
	for i, m := range g.members {
		v := soakVolume{name: s.next(m + "-r"), class: soakClass{class: g.class}}
		if err := s.history.Restore(v.name, lineages[i]); err != nil {
			return err
		}
		s.hold(v.name)
		restores = append(restores, v)
		ref := &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: members[m]}
		if err := s.start(v, groupMemberSize, ref, g.node); err != nil {
			return err
		}
	}
	return s.checkCut(g, restores)
}

// takeGroupSnapshot creates the VolumeGroupSnapshot name of g's claims and
// waits for it to be ready, returning its member VolumeSnapshots by claim.
func (s *soakRun) takeGroupSnapshot(name string, g soakGroup) (map[string]string, error) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1",
		"kind":       "VolumeGroupSnapshot",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"app": "soak"}},
		"spec": map[string]any{
			"volumeGroupSnapshotClassName": "converge",
			"source":                       map[string]any{"selector": map[string]any{"matchLabels": map[string]any{soakGroupLabel: g.name}}},
		},
	}}
	created, err := c.dynamic.Resource(volumeGroupSnapshots).Namespace(ns).Create(s.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var members map[string]string
	err = waitFor(s.ctx, 5*time.Minute, nil, func() (err error) {
		members, err = groupMembers(s.ctx, name, string(created.GetUID()), g.members)
		return err
	})
	return members, err
}

// checkCut waits for the restores of a group's members to run, and holds
// the counts of the members' records on them to soak.CheckGroupCut. A
// restore that does not run in time is a failure, not a broken invariant:
// the settle waits for it again.
func (s *soakRun) checkCut(g soakGroup, restores []soakVolume) error {
	var counts []uint64
	for i, v := range restores {
		var scanned soak.Scanned
		if err := waitFor(s.ctx, 5*time.Minute, nil, func() (err error) {
			scanned, err = s.scan(v.name, v.path())
			return err
		}); err != nil {
			return err
		}
		var n uint64
		for _, r := range scanned.Records() {
			if r.Owner == g.members[i] {
				n++
			}
		}
		counts = append(counts, n)
	}
	if err := soak.CheckGroupCut(counts); err != nil {
		s.fail(&s.broken, "group %s restored to %s and %s: %v", g.name, restores[0].name, restores[1].name, err)
	}
	s.logf("group %s restored to %s and %s: member records %v", g.name, restores[0].name, restores[1].name, counts)
	return nil
}

// hold keeps a volume from being grown or deleted until release: a
// group's restores, until their cut is checked.
func (s *soakRun) hold(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.copying[name]++
}

// release lets the volumes held go.
func (s *soakRun) release(vs *[]soakVolume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range *vs {
		s.copying[v.name]--
	}
}
