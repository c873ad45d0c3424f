package main

import (
	"os"
	"regexp"
	"testing"
	"time"

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

// TestDeployGivesTheDefaultGrace holds deploy/'s --deleted-node-grace (the
// chart's default, which test/e2e/chart holds to deploy/) to the
// command's default, which the docs give as the default.
func TestDeployGivesTheDefaultGrace(t *testing.T) {
	b, err := os.ReadFile("../../deploy/controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*- --deleted-node-grace=(\S+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/controller.yaml gives no --deleted-node-grace")
	}
	got, err := time.ParseDuration(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if got != defaultDeletedNodeGrace {
		t.Errorf("deploy/controller.yaml gives --deleted-node-grace=%v, the command's default is %v", got, defaultDeletedNodeGrace)
	}
}
