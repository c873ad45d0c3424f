package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/contract"
)

// TestDeployInstallsThePublishedDriver holds deploy/ to the published
// names the command looks after by default (deploy/controller.yaml gives
// no --driver-name): the CSIDriver and the StorageClass's provisioner are
// contract.DefaultDriverName, and every converge parameter the
// StorageClass names, commented out or not, is one CreateVolume knows.
func TestDeployInstallsThePublishedDriver(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile("../../deploy/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if strings.Contains(read("controller.yaml"), "--driver-name") {
		t.Error("deploy/controller.yaml gives --driver-name: hold it to deploy/csidriver.yaml here")
	}
	for file, re := range map[string]string{"csidriver.yaml": `(?m)^  name: (\S+)$`, "storageclass.yaml": `(?m)^provisioner: (\S+)$`} {
		got := ""
		if m := regexp.MustCompile(re).FindStringSubmatch(read(file)); m != nil {
			got = m[1]
		}
		if got != contract.DefaultDriverName {
			t.Errorf("deploy/%s names driver %q, want %s", file, got, contract.DefaultDriverName)
		}
	}
	keys := regexp.MustCompile(`(?m)^\s*#?\s*(converge\.csi\.dev/[^:\s]+):`).FindAllStringSubmatch(read("storageclass.yaml"), -1)
	if len(keys) == 0 {
		t.Fatal("deploy/storageclass.yaml names no converge parameter")
	}
	for _, k := range keys {
		if !slices.Contains(contract.CreateParameters(), k[1]) {
			t.Errorf("deploy/storageclass.yaml names parameter %s, which CreateVolume does not know", k[1])
		}
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
