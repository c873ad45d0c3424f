package compare

import (
	"fmt"
	"strings"
	"time"
)

// Path is when each step of one pod's way to Ready happened, as the
// harness saw it: from the API's watches (the node chosen, the volume
// made, the claim bound, the pod bound, the pod Ready) and from
// csi-node's log of the calls it answered (converge's ways alone). A
// zero time is a step the pod's way has not: an emptyDir's pod has no
// claim, local-path-provisioner's volume no CSI call.
type Path struct {
	Created    time.Time // the claim (or, without one, the pod) created
	NodeChosen time.Time // the scheduler's choice on the claim (its selected-node annotation)
	// Handed is when the PV controller handed the claim to its
	// provisioner (its storage-provisioner annotation): no provisioner
	// acts on a claim before.
	Handed time.Time
	// CreateStart and CreateEnd bracket csi-node's CreateVolume.
	CreateStart, CreateEnd time.Time
	PVSeen                 time.Time // the volume's PersistentVolume
	Bound                  time.Time // the claim Bound
	PodNode                time.Time // the pod bound to its node
	// StageStart is when the first NodeStageVolume began, StageEnd when
	// the first that succeeded ended; PublishEnd likewise for
	// NodePublishVolume.
	StageStart, StageEnd, PublishEnd time.Time
	Ready                            time.Time // the pod Ready
}

// The stages of a pod's path to Ready, each named by the step it ends at.
const (
	StageSchedule        = "schedule"         // created until the scheduler chose a node (for the claim, or for the pod without one)
	StageHand            = "pv-controller"    // the node chosen until the PV controller handed the claim to the provisioner
	StageProvisionerWait = "provisioner-wait" // the claim handed over until CreateVolume began (the provisioner's queue and its calls before)
	StageCreateVolume    = "create-volume"    // CreateVolume in csi-node
	StagePVCreate        = "pv-create"        // CreateVolume's answer until the PersistentVolume was seen (the provisioner's write)
	StageProvision       = "provision"        // the claim handed over until the PersistentVolume was seen, for a way without CSI calls
	StageClaimBind       = "claim-bind"       // the volume seen until its claim was Bound (the PV controller)
	StagePodBind         = "pod-bind"         // the claim Bound until the pod was bound to its node (the scheduler's binding wait)
	StageKubeletWait     = "kubelet-wait"     // the pod bound until the first NodeStageVolume began
	StageStage           = "stage"            // NodeStageVolume
	StagePublish         = "publish"          // the stage's end until NodePublishVolume's (the kubelet's gap and the publish)
	StageContainer       = "container"        // the publish's end until the pod was Ready (the sandbox, the container, its readiness)
	StageKubelet         = "kubelet"          // the pod bound until Ready, for a way without CSI calls
)

// Stages are the stages in the order of a path.
var Stages = []string{StageSchedule, StageHand, StageProvisionerWait, StageCreateVolume, StagePVCreate, StageProvision, StageClaimBind,
	StagePodBind, StageKubeletWait, StageStage, StagePublish, StageContainer, StageKubelet}

// Stages splits the time from Created to Ready into the stages p has, in
// seconds; they add up to Ready - Created exactly. A stage may be a little
// below 0 where two watches saw in the other order what happened at
// nearly the same time. It is an error when Created or Ready is missing,
// or when the CSI calls are there in part.
func (p Path) Stages() (map[string]float64, error) {
	if p.Created.IsZero() || p.Ready.IsZero() {
		return nil, fmt.Errorf("a path needs its start and Ready: %+v", p)
	}
	csi := []time.Time{p.CreateStart, p.CreateEnd, p.StageStart, p.StageEnd, p.PublishEnd}
	some, all := false, true
	for _, t := range csi {
		some = some || !t.IsZero()
		all = all && !t.IsZero()
	}
	if some && !all {
		return nil, fmt.Errorf("a path with some of its CSI calls and not all: %+v", p)
	}
	claim := !p.Bound.IsZero()
	steps := []struct {
		at   time.Time
		name string
	}{
		{p.NodeChosen, StageSchedule},
		{p.Handed, StageHand},
		{p.CreateStart, StageProvisionerWait},
		{p.CreateEnd, StageCreateVolume},
		{p.PVSeen, pick(all, StagePVCreate, StageProvision)},
		{p.Bound, StageClaimBind},
		{p.PodNode, pick(claim, StagePodBind, StageSchedule)},
		{p.StageStart, StageKubeletWait},
		{p.StageEnd, StageStage},
		{p.PublishEnd, StagePublish},
		{p.Ready, pick(all, StageContainer, StageKubelet)},
	}
	out := map[string]float64{}
	last := p.Created
	for _, s := range steps {
		if s.at.IsZero() {
			continue
		}
		out[s.name] += s.at.Sub(last).Seconds()
		last = s.at
	}
	return out, nil
}

func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

// StageStat is one stage of one way over every pod of its rounds.
type StageStat struct {
	// Mean: the stages' means add up to the mean time to Ready.
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// BreakdownTable prints, per case, the stages of each way that has them:
// the mean, p50 and p99 of each, and the sum of the means.
func BreakdownTable(cases []Case) string {
	var b strings.Builder
	for _, cs := range cases {
		fmt.Fprintf(&b, "N=%d, %s: where the time to Ready goes (seconds; the means add up to the mean time to Ready)\n", cs.N, cs.Spread)
		fmt.Fprintf(&b, "  %-17s", "stage")
		for _, w := range cs.Ways {
			fmt.Fprintf(&b, " %23s", w.Way)
		}
		fmt.Fprintf(&b, "\n  %-17s", "")
		for range cs.Ways {
			fmt.Fprintf(&b, " %23s", "mean / p50 / p99")
		}
		b.WriteString("\n")
		sums := make([]float64, len(cs.Ways))
		for _, stage := range Stages {
			have := false
			for _, w := range cs.Ways {
				_, ok := w.Stages[stage]
				have = have || ok
			}
			if !have {
				continue
			}
			fmt.Fprintf(&b, "  %-17s", stage)
			for i, w := range cs.Ways {
				s, ok := w.Stages[stage]
				if !ok {
					fmt.Fprintf(&b, " %23s", "-")
					continue
				}
				sums[i] += s.Mean
				fmt.Fprintf(&b, " %23s", fmt.Sprintf("%.3f / %.3f / %.3f", s.Mean, s.P50, s.P99))
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  %-17s", "sum of means")
		for i := range cs.Ways {
			fmt.Fprintf(&b, " %23s", fmt.Sprintf("%.3f", sums[i]))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// summarizeStages is the StageStat of each stage of rounds' paths.
func summarizeStages(rounds []Round) map[string]StageStat {
	out := map[string]StageStat{}
	for _, stage := range Stages {
		var all []float64
		for _, r := range rounds {
			all = append(all, r.Stages[stage]...)
		}
		if len(all) == 0 {
			continue
		}
		sum := 0.0
		for _, x := range all {
			sum += x
		}
		out[stage] = StageStat{Mean: sum / float64(len(all)), P50: Percentile(all, 50), P99: Percentile(all, 99)}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// AddPath adds a pod's stages to the round's.
func (r *Round) AddPath(stages map[string]float64) {
	if r.Stages == nil {
		r.Stages = map[string][]float64{}
	}
	for name, x := range stages {
		r.Stages[name] = append(r.Stages[name], x)
	}
}
