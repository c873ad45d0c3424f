package compare

import (
	"maps"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPathStages(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name string
		p    Path
		want map[string]float64
	}{{
		name: "converge",
		p: Path{Created: at(0), NodeChosen: at(100), Handed: at(200), CreateStart: at(300), CreateEnd: at(350), PVSeen: at(400), Bound: at(450),
			PodNode: at(1450), StageStart: at(1500), StageEnd: at(1600), PublishEnd: at(1700), Ready: at(2700)},
		want: map[string]float64{StageSchedule: 0.1, StageHand: 0.1, StageProvisionerWait: 0.1, StageCreateVolume: 0.05, StagePVCreate: 0.05,
			StageClaimBind: 0.05, StagePodBind: 1, StageKubeletWait: 0.05, StageStage: 0.1, StagePublish: 0.1, StageContainer: 1},
	}, {
		name: "local-path",
		p:    Path{Created: at(0), NodeChosen: at(100), Handed: at(1100), PVSeen: at(5100), Bound: at(5200), PodNode: at(6200), Ready: at(7200)},
		want: map[string]float64{StageSchedule: 0.1, StageHand: 1, StageProvision: 4, StageClaimBind: 0.1, StagePodBind: 1, StageKubelet: 1},
	}, {
		name: "emptyDir",
		p:    Path{Created: at(0), PodNode: at(30), Ready: at(1030)},
		want: map[string]float64{StageSchedule: 0.03, StageKubelet: 1},
	}, {
		// Two watches that saw the claim Bound a little before its
		// volume: a stage below 0, and the sum still exact.
		name: "watches out of order",
		p:    Path{Created: at(0), NodeChosen: at(100), PVSeen: at(500), Bound: at(490), PodNode: at(600), Ready: at(700)},
		want: map[string]float64{StageSchedule: 0.1, StageProvision: 0.4, StageClaimBind: -0.01, StagePodBind: 0.11, StageKubelet: 0.1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.Stages()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.EqualFunc(got, tc.want, near) {
				t.Errorf("stages %v, want %v", got, tc.want)
			}
			sum := 0.0
			for _, x := range got {
				sum += x
			}
			if want := tc.p.Ready.Sub(tc.p.Created).Seconds(); !near(sum, want) {
				t.Errorf("stages add up to %v, want Ready - Created = %v", sum, want)
			}
		})
	}
	for _, p := range []Path{
		{Created: t0},
		{Ready: t0},
		{Created: t0, CreateStart: t0, CreateEnd: t0, Ready: t0},
	} {
		if _, err := p.Stages(); err == nil {
			t.Errorf("%+v: no error", p)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarizeStages(t *testing.T) {
	var r0, r1 Round
	r0 = round(ConvergeThin, 0, map[string][]float64{Ready: {1, 3}})
	r0.AddPath(map[string]float64{StageSchedule: 0.5, StageContainer: 0.5})
	r0.AddPath(map[string]float64{StageSchedule: 1, StageContainer: 2})
	r1 = round(ConvergeThin, 1, map[string][]float64{Ready: {5}})
	r1.AddPath(map[string]float64{StageSchedule: 1.5, StageContainer: 3.5})
	cases := Summarize([]Round{r0, r1, round(EmptyDir, 0, map[string][]float64{Ready: {1}})})
	thin := cases[0].Ways[1]
	if thin.Way != ConvergeThin {
		t.Fatalf("ways: %+v", cases[0].Ways)
	}
	if s := thin.Stages[StageSchedule]; s != (StageStat{Mean: 1, P50: 1, P99: 1.5}) {
		t.Errorf("schedule: %+v", s)
	}
	if s := thin.Stages[StageContainer]; s != (StageStat{Mean: 2, P50: 2, P99: 3.5}) {
		t.Errorf("container: %+v", s)
	}
	if cases[0].Ways[0].Stages != nil {
		t.Errorf("the emptyDir's rounds had no paths, and it has stages: %+v", cases[0].Ways[0].Stages)
	}
	table := BreakdownTable(cases)
	for _, want := range []string{"schedule", "1.000 / 1.000 / 1.500", "sum of means", "3.000"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table has no %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, StageProvision) {
		t.Errorf("the table has a stage no way has:\n%s", table)
	}
}
