package reconciler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// TestConditionTable walks condition, the one decision of a volume's
// condition, through each reason it gives, from a record and an
// observation built by hand: the published reason and health of each
// case, a piece of its message, and the paths it names unusable.
func TestConditionTable(t *testing.T) {
	const staging, target = "/staging/v1", "/target/v1"
	dev := host.DevNum{Major: 7, Minor: 3}
	ranOutAt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	next := time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)
	record := func() *state.Volume {
		return &state.Volume{
			ID:        "v1",
			Stage:     &state.Stage{Path: staging, Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER", Generation: 2},
			Publishes: map[string]*state.Publish{target: {Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER", Generation: 3}},
		}
	}
	// healthy is what a pass sees of the record above when all is well.
	healthy := func() *actual {
		return &actual{
			loop:         &host.Device{Device: "/dev/loop3", Dev: dev, BackingSize: 100 << 20, BackingAllocated: 100 << 20},
			stagingMount: &host.Mount{Path: staging, Dev: dev, Root: "/", Source: "/dev/loop3"},
			stageInPlace: true,
			targets:      map[string]*host.Mount{target: {Path: target, Dev: dev, Root: "/"}},
			mountIDs:     map[string]uint64{staging: 41, target: 42},
			pool:         host.PoolSpace{Known: true, Total: 10 << 30, Free: 5 << 30},
			poolGuard:    1 << 30,
			poolName:     "fast",
		}
	}
	seenFulfilled := func(state.IntentKey, int64) bool { return true }
	neverFulfilled := func(state.IntentKey, int64) bool { return false }
	fail := func(kind actionKind, gen int64, attempts int, final bool, e *classified.Error) *failure {
		return &failure{act: action{kind: kind, generation: gen}, attempts: attempts, next: next, err: e, final: final}
	}
	dataLoss := &classified.Error{Kind: classified.KindDataLoss, Message: "no filesystem on the image of v1"}
	busy := &classified.Error{Kind: classified.KindInternal, Message: "device busy"}

	for _, tc := range []struct {
		name     string
		volume   func(v *state.Volume)
		actual   func(a *actual)
		lost     func(state.IntentKey, int64) bool
		failure  *failure
		health   state.Health
		reason   contract.Reason
		message  string
		unusable []string
	}{
		{name: "healthy"},
		{name: "no stage", volume: func(v *state.Volume) { v.Stage = nil }, actual: func(a *actual) { a.loop = nil }, failure: fail(actStage, 2, 1, true, dataLoss)},
		{name: "stage withdrawn", volume: func(v *state.Volume) { v.Stage.Deleting = true }, actual: func(a *actual) { a.loop = nil }},
		{name: "not yet set up", lost: neverFulfilled, actual: func(a *actual) { a.loop, a.stagingMount, a.stageInPlace, a.targets = nil, nil, false, nil },
			unusable: []string{staging, target}},
		{name: "attached twice", actual: func(a *actual) { a.extraLoops = []string{"/dev/loop9"} },
			health: state.Degraded, reason: contract.DeviceAttachedTwice, message: "attached more than once (/dev/loop3, /dev/loop9)"},
		{name: "attached twice, not published", volume: func(v *state.Volume) { v.Publishes = nil }, actual: func(a *actual) { a.extraLoops = []string{"/dev/loop9"} },
			health: state.Inaccessible, reason: contract.DeviceAttachedTwice, message: "it is not mounted until"},
		{name: "device detached", lost: seenFulfilled, actual: func(a *actual) { a.loop, a.stagingMount, a.stageInPlace, a.targets = nil, nil, false, nil },
			health: state.Inaccessible, reason: contract.DeviceDetached, message: "the loop device of volume v1 is gone", unusable: []string{staging, target}},
		{name: "staging mount missing", lost: seenFulfilled, actual: func(a *actual) { a.stagingMount, a.stageInPlace = nil, false },
			health: state.Degraded, reason: contract.StagingMountMissing, message: "nothing is mounted at the staging path " + staging, unusable: []string{staging}},
		{name: "staging path taken", actual: func(a *actual) {
			a.stagingMount, a.stageInPlace, a.targets = &host.Mount{Path: staging, Source: "tmpfs"}, false, nil
		}, lost: neverFulfilled,
			health: state.Inaccessible, reason: contract.StagingPathTaken, message: "holds another mount (tmpfs)", unusable: []string{staging, target}},
		{name: "filesystem unusable", actual: func(a *actual) { a.unusable = "shut down" },
			health: state.Inaccessible, reason: contract.FilesystemUnusable, message: "volume v1: shut down; unmounting and mounting it again", unusable: []string{staging, target}},
		{name: "filesystem unusable, mounted elsewhere", actual: func(a *actual) { a.unusable, a.foreignMounts = "shut down", []string{"/pod/sub"} },
			health: state.Inaccessible, reason: contract.FilesystemUnusable, message: "also mounted at /pod/sub", unusable: []string{staging, target}},
		{name: "read-only after errors", actual: func(a *actual) { a.errorsRO = true },
			health: state.Degraded, reason: contract.FilesystemReadOnly, message: "went read-only after errors; it is checked"},
		{name: "read-only after running out", volume: func(v *state.Volume) { v.Stage.SpaceRanOutAt, v.Stage.SpaceRanOutUnder = ranOutAt, 41 },
			actual: func(a *actual) { a.errorsRO = true },
			health: state.Degraded, reason: contract.FilesystemReadOnly, message: "ran out of space under it at 2026-01-02T03:04:05Z"},
		{name: "detach pending", actual: func(a *actual) { a.loop.AutoClear = true },
			health: state.Degraded, reason: contract.DeviceDetachPending, message: "loop device /dev/loop3 of volume v1 was detached from outside"},
		{name: "publish mount unusable", actual: func(a *actual) { a.unusableTargets = map[string]string{target: "EIO"} },
			health: state.Inaccessible, reason: contract.PublishMountUnusable, message: "at " + target + " is corrupted (EIO)", unusable: []string{target}},
		{name: "publish mount missing", lost: seenFulfilled, actual: func(a *actual) { a.targets = nil },
			health: state.Inaccessible, reason: contract.PublishMountMissing, message: "volume v1 is not mounted at " + target, unusable: []string{target}},
		{name: "publish not yet mounted", lost: neverFulfilled, actual: func(a *actual) { a.targets = nil }, unusable: []string{target}},
		{name: "thin, pool full", volume: func(v *state.Volume) { v.Provisioning = state.ProvisionThin },
			actual: func(a *actual) { a.pool.Free, a.loop.BackingAllocated = 4096, 10<<20 },
			health: state.Degraded, reason: contract.PoolFull, message: "pool fast is full (4096 bytes free): writes to the 94371840 bytes"},
		{name: "space ran out", volume: func(v *state.Volume) { v.Stage.SpaceRanOutAt, v.Stage.SpaceRanOutUnder = ranOutAt, 41 },
			health: state.Degraded, reason: contract.SpaceRanOut, message: "pool fast ran out of space at 2026-01-02T03:04:05Z under volume v1"},
		{name: "space ran out under an older mount", volume: func(v *state.Volume) { v.Stage.SpaceRanOutAt, v.Stage.SpaceRanOutUnder = ranOutAt, 40 }},
		{name: "thin, pool nearly full", volume: func(v *state.Volume) { v.Provisioning = state.ProvisionThin },
			actual: func(a *actual) { a.pool.Free = 512 << 20 },
			health: state.Degraded, reason: contract.PoolNearlyFull, message: "pool fast has 536870912 bytes free, below the guard of 1073741824 bytes"},
		{name: "thin, pool at its guard", volume: func(v *state.Volume) { v.Provisioning = state.ProvisionThin },
			actual: func(a *actual) { a.pool.Free = 1 << 30 }},
		{name: "thin, pool not observed", volume: func(v *state.Volume) { v.Provisioning = state.ProvisionThin },
			actual: func(a *actual) { a.pool = host.PoolSpace{} }},
		{name: "thick, pool nearly full", actual: func(a *actual) { a.pool.Free = 512 << 20 }},
		{name: "space not reserved", actual: func(a *actual) { a.pool.Free, a.loop.BackingAllocated = 1<<20, 10<<20 },
			health: state.Degraded, reason: contract.SpaceNotReserved, message: "94371840 bytes of the image of volume v1 are not allocated and pool fast has 1048576 bytes free"},
		{name: "filesystem missing", failure: fail(actStage, 2, 1, true, dataLoss), actual: func(a *actual) { a.stagingMount, a.stageInPlace, a.targets = nil, false, nil },
			lost: neverFulfilled, health: state.DataLost, reason: contract.FilesystemMissing, message: "no filesystem on the image of v1", unusable: []string{staging, target}},
		{name: "filesystem missing comes before what is observed", failure: fail(actStage, 2, 1, true, dataLoss), actual: func(a *actual) { a.errorsRO = true },
			health: state.DataLost, reason: contract.FilesystemMissing, message: "no filesystem on the image of v1"},
		{name: "filesystem missing of an older stage", failure: fail(actStage, 1, 1, true, dataLoss)},
		{name: "grow failed for good", failure: fail(actGrowFs, 2, 1, true, busy),
			health: state.Degraded, reason: contract.GrowFailed, message: "grow filesystem of volume v1 failed (device busy); tried again when the expansion is asked for again"},
		{name: "grow failing", failure: fail(actGrowDevice, 2, 2, false, busy),
			health: state.Degraded, reason: contract.GrowFailed, message: "growing volume v1 failed 2 times (device busy); retrying at 2026-01-02T03:05:00Z"},
		{name: "operation failing", failure: fail(actReserve, 2, repeatedFailures, false, busy),
			health: state.Degraded, reason: contract.OperationFailing, message: "reserve space of volume v1 failed 3 times in a row (device busy)"},
		{name: "operation failed once", failure: fail(actReserve, 2, repeatedFailures-1, false, busy)},
		{name: "observed comes before failing", failure: fail(actReserve, 2, repeatedFailures, false, busy), actual: func(a *actual) { a.errorsRO = true },
			health: state.Degraded, reason: contract.FilesystemReadOnly, message: "went read-only after errors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, a, lost := record(), healthy(), tc.lost
			if tc.volume != nil {
				tc.volume(v)
			}
			if tc.actual != nil {
				tc.actual(a)
			}
			if lost == nil {
				lost = seenFulfilled
			}
			c := condition(v, a, lost, tc.failure)
			if c.Abnormal != (tc.reason != "") || c.Health != tc.health || c.Reason != tc.reason {
				t.Fatalf("got %v %q %q (%s), want abnormal %v, %q %q", c.Abnormal, c.Health, c.Reason, c.Message, tc.reason != "", tc.health, tc.reason)
			}
			if !strings.Contains(c.Message, tc.message) || tc.message == "" && c.Message != "" {
				t.Errorf("message: got %q, want one with %q", c.Message, tc.message)
			}
			if !slices.Equal(c.Unusable, tc.unusable) {
				t.Errorf("unusable: got %q, want %q", c.Unusable, tc.unusable)
			}
		})
	}
}
