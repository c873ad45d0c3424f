package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/converge-csi/converge/pkg/contract"
)

// The soak's room on each node. Its plan makes volumes faster than it
// deletes them (a create every 20 s, a copy every 26 s, a group's two
// restores every 90 s, a delete every 30 s): past a few minutes, a node
// would hold csi-node's --max-volumes, or a pool would have no room left
// for another volume, the scheduler would place no more pods there
// ("exceed max volume count", "did not have enough free storage"), and
// what the soak made after would stay Pending, as on any cluster asked for
// more than its nodes take. So, as an operator makes room, the soak
// deletes one of its volumes on a full node, or in a full pool, before it
// makes another there.

// roomPerNode is how many volumes of the soak's pods a node holds before
// the soak deletes one to make another: the node's --max-volumes, less
// what the soak's events under way may add before the scheduler counts
// them.
const roomPerNode = maxVolumesPerNode - 8

// spareSpace is the room a pool keeps beside a new volume before the soak
// deletes one of its volumes there: what the soak's events under way
// (copies, a group's restores, grows) may take before csi-provisioner
// publishes the pool's capacity again.
var spareSpace = resource.MustParse("1Gi")

// makeRoom makes room for a volume of class, of need bytes, on each of
// nodes, deleting one of the soak's volumes there, picked by draw, when
// the node's pods use roomPerNode or more of the soak's claims (as the
// scheduler counts a node's volumes: the claims of the pods placed on it),
// and one of those in the class's pool when the class's capacity on the
// node (its CSIStorageCapacity, as the scheduler reads it) is short of
// need and spareSpace. A volume being copied, or a group's, is not picked;
// a pool being filled on purpose is left full; and a pool's capacity
// makes one deletion until csi-provisioner publishes it again.
func (s *soakRun) makeRoom(draw int, class string, need resource.Quantity, nodes ...string) error {
	pods, err := c.client.CoreV1().Pods(ns).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	used := map[string]map[string]bool{} // node → claims
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		if used[p.Spec.NodeName] == nil {
			used[p.Spec.NodeName] = map[string]bool{}
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				used[p.Spec.NodeName][v.PersistentVolumeClaim.ClaimName] = true
			}
		}
	}
	caps, err := c.client.StorageV1().CSIStorageCapacities(daemonSetNamespace).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pool := s.poolOf[class]
	want := need.DeepCopy()
	want.Add(spareSpace)
	for _, node := range nodes {
		if len(used[node]) >= roomPerNode {
			why := fmt.Sprintf("%s holds %d of the soak's volumes (room for %d)", node, len(used[node]), roomPerNode)
			if err := s.deleteOneOf(draw, why, func(v soakVolume) bool { return used[node][v.name] }); err != nil {
				return err
			}
		}
		for _, cp := range caps.Items {
			if cp.StorageClassName != class || cp.NodeTopology == nil || cp.NodeTopology.MatchLabels[contract.TopologyKey] != node ||
				cp.Capacity == nil || cp.Capacity.Cmp(want) >= 0 {
				continue
			}
			s.mu.Lock()
			skip := s.filling[node+"/"+pool] || s.spaceMade[cp.Name] == cp.ResourceVersion
			if !skip {
				s.spaceMade[cp.Name] = cp.ResourceVersion
			}
			s.mu.Unlock()
			if skip {
				continue
			}
			why := fmt.Sprintf("pool %s of %s has %s for class %s (a new volume wants %s and %s spare)", pool, node, cp.Capacity, class, need.String(), spareSpace.String())
			if err := s.deleteOneOf(draw, why, func(v soakVolume) bool { return used[node][v.name] && s.poolOf[v.class.class] == pool }); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteOneOf deletes one of the soak's volumes that in says are
// candidates, picked by draw, and not being copied nor removed already;
// why says what room it makes. None is a no-op.
func (s *soakRun) deleteOneOf(draw int, why string, in func(soakVolume) bool) error {
	var names []string
	s.mu.Lock()
	for n, v := range s.volumes {
		if in(v) && s.copying[n] == 0 && !s.removing[n] {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var v soakVolume
	if len(names) > 0 {
		// Marked as it is picked: another maker of room picks another.
		v = s.volumes[names[draw%len(names)]]
		s.removing[v.name] = true
	}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	s.logf("%s: deleting %s", why, v.name)
	return s.removeMarked(v)
}

// roomForPending makes room, as an operator would once the plan has run,
// for the claims it left Pending on a node whose pool had no room for
// them. A copy and a group's restores go to their source's node, however
// full its pool, and makeRoom deletes one volume at a time, once for each
// capacity csi-provisioner publishes, while the plan may make several
// there meanwhile: so a pool can end promised to the full with claims
// still asking (a soak saw eight). In each pool of each node it deletes
// the soak's volumes placed there, other than the Pending claims' sources,
// until what they hold covers what the claims pinned there ask (a clone
// of a claim twice: the snapshot it is copied through, then itself) above
// the capacity the scheduler reads, and again once those are gone, for at
// most roomRounds rounds. It returns how many it deleted.
func (s *soakRun) roomForPending() (int, error) {
	// Round after round, as what a round frees may be short of what the
	// capacity, read at 0 when a pool is over-promised, did not say.
	deleted := 0
	for range roomRounds {
		gone, err := s.roomForPendingOnce()
		deleted += len(gone)
		if err != nil || len(gone) == 0 {
			return deleted, err
		}
		// csi-provisioner publishes the pool's capacity again as it
		// deletes each volume.
		if err := waitFor(s.ctx, 2*time.Minute, nil, func() error {
			for _, n := range gone {
				if _, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(s.ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("claim %s not yet deleted: %v", n, err)
				}
			}
			return nil
		}); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// roomRounds bounds roomForPending's rounds.
const roomRounds = 4

// roomForPendingOnce is a round of roomForPending: the volumes it deleted.
func (s *soakRun) roomForPendingOnce() ([]string, error) {
	claims, err := c.client.CoreV1().PersistentVolumeClaims(ns).List(s.ctx, metav1.ListOptions{LabelSelector: "app=soak"})
	if err != nil {
		return nil, err
	}
	pods, err := c.client.CoreV1().Pods(ns).List(s.ctx, metav1.ListOptions{LabelSelector: "app=soak"})
	if err != nil {
		return nil, err
	}
	pinned := map[string]string{}          // claim → the node its pod must run on
	placed := map[string]map[string]bool{} // node → claims of the pods placed there
	for _, p := range pods.Items {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			if n := p.Spec.NodeSelector[hostnameLabel]; n != "" {
				pinned[v.PersistentVolumeClaim.ClaimName] = n
			}
			if n := p.Spec.NodeName; n != "" {
				if placed[n] == nil {
					placed[n] = map[string]bool{}
				}
				placed[n][v.PersistentVolumeClaim.ClaimName] = true
			}
		}
	}
	type place struct{ node, pool string }
	need := map[place]int64{}
	least := map[place]int64{} // the least a Pending claim there asks
	classes := map[place][]string{}
	keep := map[string]bool{} // the Pending claims' sources
	for _, pvc := range claims.Items {
		node := pinned[pvc.Name]
		if pvc.Status.Phase != corev1.ClaimPending || node == "" || pvc.Spec.StorageClassName == nil {
			continue
		}
		at := place{node, s.poolOf[*pvc.Spec.StorageClassName]}
		size := pvc.Spec.Resources.Requests.Storage().Value()
		if ref := pvc.Spec.DataSourceRef; ref != nil {
			switch ref.Kind {
			case "PersistentVolumeClaim":
				keep[ref.Name] = true
				size *= 2
			case "VolumeSnapshot":
				snap, err := c.dynamic.Resource(volumeSnapshots).Namespace(ns).Get(s.ctx, ref.Name, metav1.GetOptions{})
				if err == nil {
					src, _, _ := unstructured.NestedString(snap.Object, "spec", "source", "persistentVolumeClaimName")
					keep[src] = true
				}
			}
		}
		need[at] += size
		classes[at] = append(classes[at], *pvc.Spec.StorageClassName)
		if least[at] == 0 || size < least[at] {
			least[at] = size
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	caps, err := c.client.StorageV1().CSIStorageCapacities(daemonSetNamespace).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sizes := map[string]int64{}
	for _, pvc := range claims.Items {
		sizes[pvc.Name] = pvc.Status.Capacity.Storage().Value()
	}
	places := slices.SortedFunc(maps.Keys(need), func(a, b place) int { return strings.Compare(a.node+"/"+a.pool, b.node+"/"+b.pool) })
	var deleted []string
	for _, at := range places {
		// What the scheduler reads for the Pending claims' classes there,
		// the least of them.
		have := int64(-1)
		for _, cp := range caps.Items {
			if cp.NodeTopology == nil || cp.NodeTopology.MatchLabels[contract.TopologyKey] != at.node || cp.Capacity == nil ||
				!slices.Contains(classes[at], cp.StorageClassName) {
				continue
			}
			if v := cp.Capacity.Value(); have < 0 || v < have {
				have = v
			}
		}
		// Room is made only for claims converge has no room for: one
		// Pending where csi-node says it has is a fault of converge's,
		// which the settle is left to find.
		if room, err := s.poolRoom(at.node, at.pool); err != nil || room >= least[at] {
			s.logf("room for the Pending claims in pool %s of %s: csi-node has %d bytes for them (%v): none deleted", at.pool, at.node, room, err)
			continue
		}
		// No spare: the plan is over, and the next round sees what
		// this one left short.
		short := need[at] - max(have, 0)
		s.mu.Lock()
		var names []string
		for n, v := range s.volumes {
			if placed[at.node][n] && s.poolOf[v.class.class] == at.pool && !keep[n] && s.copying[n] == 0 && !s.removing[n] {
				names = append(names, n)
			}
		}
		s.mu.Unlock()
		slices.Sort(names)
		for _, n := range names {
			if short <= 0 {
				break
			}
			s.mu.Lock()
			v, there := s.volumes[n]
			s.mu.Unlock()
			if !there {
				continue
			}
			s.logf("room for the Pending claims in pool %s of %s (%d bytes asked, %d to free): deleting %s", at.pool, at.node, need[at], short, n)
			if err := s.removeVolume(v); err != nil {
				s.logf("room for the Pending claims: %s: %v", n, err) // the next one, then
				continue
			}
			s.mu.Lock()
			_, kept := s.volumes[n] // a copy of it began
			s.mu.Unlock()
			if !kept {
				short -= sizes[n]
				deleted = append(deleted, n)
			}
		}
		if short > 0 {
			s.logf("room for the Pending claims in pool %s of %s: %d bytes still short, and no volume left to delete there", at.pool, at.node, short)
		}
	}
	return deleted, nil
}

// poolRoom is the most csi-node on node says pool can promise a new
// volume, thick or thin.
func (s *soakRun) poolRoom(node, pool string) (int64, error) {
	for _, n := range s.nodes {
		if n.node != node {
			continue
		}
		st, err := n.status()
		if err != nil {
			return 0, err
		}
		for _, p := range st.Pools {
			if p.Name == pool {
				return max(p.ThickAvailableBytes, p.ThinAvailableBytes), nil
			}
		}
		return 0, fmt.Errorf("csi-node status on %s lists no pool %s", node, pool)
	}
	return 0, fmt.Errorf("no node %s", node)
}
