// Command cni is the pod network of the end-to-end cluster: a CNI plugin
// that gives each pod sandbox an eth0 of its own and nothing else. The
// interface lives inside the pod's network namespace with one link-local
// address (169.254.0.0/16, derived from the container ID), so
// that containerd's CRI finds the eth0 it requires while nothing is added to
// the host: no bridge, no host address, no route. The interface is one end
// of a veth pair whose other end stays in the pod's namespace too (this
// machine kind's kernel has no dummy device). Pods reach nothing through
// it, which is all the storage tests need.
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
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
	switch os.Getenv("CNI_COMMAND") {
	case "VERSION":
		return json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": cniVersion, "supportedVersions": []string{"0.4.0", cniVersion}})
	case "ADD":
		h := fnv.New32a()
		h.Write([]byte(id))
		n := h.Sum32()
		addr := fmt.Sprintf("169.254.%d.%d/32", 1+n%253, 1+(n>>8)%253)
		for _, args := range [][]string{
			{"link", "add", ifname, "type", "veth", "peer", "name", "peer-" + ifname},
			{"link", "set", "peer-" + ifname, "up"},
			{"addr", "add", addr, "dev", ifname},
			{"link", "set", ifname, "up"},
		} {
			if err := ip(netns, args...); err != nil {
				return err
			}
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]any{
			"cniVersion": cniVersion,
			"interfaces": []map[string]any{{"name": ifname, "sandbox": netns}},
			"ips":        []map[string]any{{"address": addr, "interface": 0}},
		})
	case "DEL":
		// The namespace may be gone already; then so is the interface.
		if netns != "" {
			ip(netns, "link", "del", ifname)
		}
		return nil
	case "CHECK", "GC", "STATUS":
		return nil
	}
	return fmt.Errorf("unknown CNI_COMMAND %q", os.Getenv("CNI_COMMAND"))
}

// ip runs ip(8) inside the network namespace at netns.
func ip(netns string, args ...string) error {
	out, err := exec.Command("nsenter", append([]string{"--net=" + netns, "ip"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %v in %s: %v: %s", args, netns, err, out)
	}
	return nil
}
