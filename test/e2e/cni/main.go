// Command cni is the pod network of the end-to-end cluster: a CNI plugin
// that joins each pod sandbox to its node as a machine's pods are. Each
// node's daemons run in a network namespace of the node's own (nodens.go),
// so this adds nothing to the host: the pod's eth0 is one end of a veth
// pair whose other end is in the node's namespace, with one link-local
// address (169.254.0.0/16, derived from the container ID), a default route
// to the node, and the node's route back. The kubelet reaches a pod (its
// probes) and a pod reaches what the node serves, the kubernetes Service
// among it (nodenet.go); no packet leaves the test's namespaces.
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"strconv"
)

const cniVersion = "1.0.0"

func main() {
	if err := run(); err != nil {
		json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": cniVersion, "code": 999, "msg": err.Error()})
		os.Exit(1)
	}
}

func run() error {
	io.Copy(io.Discard, os.Stdin) // the network configuration: nothing to read
	netns, ifname, id := os.Getenv("CNI_NETNS"), os.Getenv("CNI_IFNAME"), os.Getenv("CNI_CONTAINERID")
	// The node's end, named after the sandbox (at most 15 bytes).
	node := "cv" + id[:min(len(id), 12)]
	switch os.Getenv("CNI_COMMAND") {
	case "VERSION":
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": cniVersion, "supportedVersions": []string{"0.4.0", cniVersion}})
	case "ADD":
		h := fnv.New32a()
		h.Write([]byte(id))
		n := h.Sum32()
		addr := fmt.Sprintf("169.254.%d.%d", 1+n%253, 1+(n>>8)%253)
		// Made in the pod's namespace, the node's end moved to this
		// plugin's, which is the node's (containerd's).
		for _, args := range [][]string{
			{"link", "add", ifname, "type", "veth", "peer", "name", node, "netns", strconv.Itoa(os.Getpid())},
			{"addr", "add", addr + "/32", "dev", ifname},
			{"link", "set", ifname, "up"},
			{"route", "add", "default", "dev", ifname},
		} {
			if err := ip(netns, args...); err != nil {
				return err
			}
		}
		for _, args := range [][]string{
			{"link", "set", node, "up"},
			{"route", "add", addr + "/32", "dev", node},
		} {
			if err := ip("", args...); err != nil {
				return err
			}
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]any{
			"cniVersion": cniVersion,
			"interfaces": []map[string]any{{"name": ifname, "sandbox": netns}},
			"ips":        []map[string]any{{"address": addr + "/32", "interface": 0}},
		})
	case "DEL":
		// Either end gone takes the other, and the route, with it; the
		// pod's namespace may be gone already.
		ip("", "link", "del", node)
		return nil
	case "CHECK", "GC", "STATUS":
		return nil
	}
	return fmt.Errorf("unknown CNI_COMMAND %q", os.Getenv("CNI_COMMAND"))
}

// ip runs ip(8) inside the network namespace at netns, or in this
// process's when netns is "".
func ip(netns string, args ...string) error {
	cmd := exec.Command("ip", args...)
	if netns != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=" + netns, "ip"}, args...)...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %v in %q: %v: %s", args, netns, err, out)
	}
	return nil
}
