package e2e

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
