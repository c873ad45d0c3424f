// Command cni is the pod network of the end-to-end cluster: a CNI plugin
// that gives each pod sandbox an eth0 of its own and nothing else. The
// interface lives inside the pod's network namespace with one link-local
// address (169.254.0.0/16, derived from the container ID), so
// that containerd's CRI finds the eth0 it requires while nothing is added to
// the host: no bridge, no host address, no route. The interface is one end
// of a veth pair whose other end stays in the pod's namespace too (this
// machine kind's kernel has no dummy device). Pods reach nothing through
// it, which is all the storage tests need, but the API server: the
// configuration's serviceIP (the "kubernetes" Service's ClusterIP) is
// added to the interface too, and the harness's service proxy, asked over
// the unix socket serviceProxy with the namespace's descriptor, listens
// there and carries each connection to the API server (see svcproxy.go).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

const cniVersion = "1.0.0"

func main() {
	if err := run(); err != nil {
		json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": cniVersion, "code": 999, "msg": err.Error()})
		os.Exit(1)
	}
}

func run() error {
	var conf struct {
		ServiceIP    string `json:"serviceIP"`
		ServiceProxy string `json:"serviceProxy"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&conf); err != nil && err != io.EOF {
		return fmt.Errorf("reading the network configuration: %w", err)
	}
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
		if conf.ServiceProxy != "" {
			if err := ip(netns, "addr", "add", conf.ServiceIP+"/32", "dev", ifname); err != nil {
				return err
			}
			ns, err := os.Open(netns)
			if err != nil {
				return err
			}
			err = askProxy(conf.ServiceProxy, "add "+id, int(ns.Fd()))
			ns.Close()
			if err != nil {
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
		if conf.ServiceProxy != "" {
			// Gone with the harness, the proxy has nothing left to close.
			askProxy(conf.ServiceProxy, "del "+id, -1)
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

// askProxy sends the harness's service proxy a request, with the
// descriptor fd unless it is negative, and waits for its answer.
func askProxy(socket, request string, fd int) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	var oob []byte
	if fd >= 0 {
		oob = syscall.UnixRights(fd)
	}
	if _, _, err := conn.(*net.UnixConn).WriteMsgUnix([]byte(request), oob, nil); err != nil {
		return err
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		return fmt.Errorf("service proxy: %s", reply)
	}
	return nil
}
