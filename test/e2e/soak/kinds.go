package soak

import "time"

// Sidecars are the containers of the node pod the soak kills, beside
// csi-node.
var Sidecars = []string{"csi-provisioner", "csi-resizer", "csi-snapshotter", "node-driver-registrar"}

// Kinds are the soak's operations and faults, with how often each
// comes on average. Targets of 1000 is a draw an operation picks its
// volume or kind of claim with (modulo what there is).
func Kinds(nodes int) []Kind {
	return []Kind{
		{Name: "create", Every: 20 * time.Second, Targets: 1000},
		{Name: "grow", Every: 40 * time.Second, Targets: 1000},
		{Name: "snapshot", Every: 45 * time.Second, Targets: 1000},
		{Name: "clone", Every: 60 * time.Second, Targets: 1000},
		{Name: "group-snapshot", Every: 90 * time.Second, Targets: 1000},
		{Name: "delete", Every: 30 * time.Second, Targets: 1000},
		{Name: "kill-csi-node", Every: 60 * time.Second, Targets: nodes},
		{Name: "stop-csi-node", Every: 120 * time.Second, Targets: nodes, Hold: [2]time.Duration{3 * time.Second, 20 * time.Second}},
		{Name: "kill-sidecar", Every: 45 * time.Second, Targets: nodes * len(Sidecars)},
		{Name: "kill-controller", Every: 120 * time.Second, Targets: 1},
		{Name: "restart-kubelet", Every: 90 * time.Second, Targets: nodes},
		// Past the node monitor's grace (40 s): the Node goes NotReady.
		{Name: "kubelet-down", Every: 240 * time.Second, Targets: nodes, Hold: [2]time.Duration{45 * time.Second, 75 * time.Second}},
		{Name: "restart-apiserver", Every: 300 * time.Second, Targets: 1},
		// A power loss: down for the hold, then up on what its disks kept.
		{Name: "reboot", Every: 300 * time.Second, Targets: nodes, Hold: [2]time.Duration{10 * time.Second, 30 * time.Second}},
		{Name: "fill-pool", Every: 240 * time.Second, Targets: 1000, Hold: [2]time.Duration{20 * time.Second, 60 * time.Second}},
		{Name: "failpoint", Every: 60 * time.Second, Targets: 1000 * nodes, Hold: [2]time.Duration{5 * time.Second, 30 * time.Second}},
	}
}

// FullSeed is the seed whose plan of two minutes on two nodes holds every
// kind of event (TestFullSeedHoldsEveryKind): make test's short soak runs
// it beside a random seed (hack/test.sh's SOAK_SEED, full+0).
const FullSeed = 116
