package controller

import (
	"fmt"
	"hash/fnv"

	"github.com/converge-csi/converge/pkg/contract"
)

// nodeSep separates a volume's or a snapshot's name from the name of the
// node it lives on in its ID: Kubernetes node names (DNS subdomains) never
// hold it, so the node is what follows the last one.
const nodeSep = contract.NodeSep

// localID returns the ID of the volume or snapshot named name on this
// node: the name and the node's name, so that every node can tell where
// it lives. A name too long for both keeps what fits of it and a hash of
// the whole (names differ in their end as often as in their start).
func (c *Controller) localID(name string) string {
	suffix := nodeSep + c.topology[contract.TopologyKey]
	if len(name)+len(suffix) <= contract.MaxIDLength {
		return name + suffix
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	sum := fmt.Sprintf("%016x", h.Sum64())
	keep := contract.MaxIDLength - len(suffix) - len(sum) - 1
	if keep < 1 {
		return name + suffix // the node's name alone is too long: refused
	}
	return name[:keep] + "-" + sum + suffix
}

// nodeOf returns the node an ID names, "" when it names none. A volume
// made before volume IDs named their node has its name as its ID, which
// may hold the separator too: an ID that has no image here may be of
// another node, never one that has.
func nodeOf(id string) string {
	return contract.NodeOfID(id)
}
