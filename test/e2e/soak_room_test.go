package e2e

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The soak's room on each node. Its plan makes volumes faster than it
// deletes them (a create every 20 s, a copy every 26 s, a group's two
// restores every 90 s, a delete every 30 s): past a few minutes, a node
// would hold csi-node's --max-volumes, the scheduler would place no more
// pods there ("exceed max volume count"), and what the soak made after
// would stay Pending, as on any cluster asked for more than its nodes
// take. So, as an operator makes room, the soak deletes one of a full
// node's volumes before it makes another there.

// roomPerNode is how many volumes of the soak's pods a node holds before
// the soak deletes one to make another: the node's --max-volumes, less
// what the soak's events under way may add before the scheduler counts
// them.
const roomPerNode = maxVolumesPerNode - 8

// makeRoom deletes, on each of nodes whose pods use roomPerNode or more
// of the soak's claims (as the scheduler counts a node's volumes: the
// claims of the pods placed on it), one of the soak's volumes there,
// picked by draw; a volume being copied, or a group's, is not picked.
func (s *soakRun) makeRoom(draw int, nodes ...string) error {
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
	for _, node := range nodes {
		if len(used[node]) < roomPerNode {
			continue
		}
		var names []string
		s.mu.Lock()
		for n := range s.volumes {
			if used[node][n] && s.copying[n] == 0 {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		var v soakVolume
		if len(names) > 0 {
			v = s.volumes[names[draw%len(names)]]
		}
		s.mu.Unlock()
		if len(names) == 0 {
			continue
		}
		s.logf("%s holds %d of the soak's volumes (room for %d): deleting %s", node, len(used[node]), roomPerNode, v.name)
		if err := s.removeVolume(v); err != nil {
			return err
		}
	}
	return nil
}
