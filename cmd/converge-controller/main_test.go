package main

import (
	"testing"

	"github.com/converge-csi/converge/pkg/controller"
	"github.com/converge-csi/converge/pkg/driver"
)

// TestSameNamesAsCSINode holds the controller's driver name and topology
// key to csi-node's: the controller may not import the node plugin.
func TestSameNamesAsCSINode(t *testing.T) {
	if defaultDriverName != driver.DefaultDriverName || topologyKey != controller.TopologyKey {
		t.Errorf("converge-controller: %s, %s; csi-node: %s, %s", defaultDriverName, topologyKey, driver.DefaultDriverName, controller.TopologyKey)
	}
}
