package e2e

import "testing"

// TestConcurrent runs, at the same time, the tests that take minutes and
// disturb nothing the others rely on: they restart, stop, replace or add
// nothing of the cluster's (no daemon, node or DaemonSet), and each works
// on objects of its own names (its claims, pods, classes and snapshots)
// and checks only what concerns them. Each is a subtest named as the test
// was (-run 'TestConcurrent/TestGroupSnapshotConsistency' runs one);
// -test.parallel bounds how many run at once (3 in make test). One after
// the other they took 16 minutes of a warm run here, the storage suite 8
// of them; at once, about as long as the storage suite alone. It is the
// run's first test (its file's name sorts first: Go runs a package's tests
// in the order of its files' names), so that they meet the cluster as it
// came up, one node. With -storage-suite=all they run one after the
// other: that suite's [Serial] and [Disruptive] tests need the cluster to
// themselves.
func TestConcurrent(t *testing.T) {
	together := *storageSuite != "all"
	for _, q := range []struct {
		name string
		run  func(*testing.T)
	}{
		// The longest first, so that the others run beside it.
		{"TestExternalStorage", testExternalStorage},
		{"TestGroupSnapshotConsistency", testGroupSnapshotConsistency},
		{"TestGroupContentDeletedAfterAMissedLook", testGroupContentDeletedAfterAMissedLook},
		{"TestExternalStorageSnapshotsInPool", testExternalStorageSnapshotsInPool},
		// Seconds each, beside the storage suite.
		{"TestDataOutlivesPod", testDataOutlivesPod},
		{"TestRawBlock", testRawBlock},
		{"TestSharedVolume", testSharedVolume},
		{"TestIOLimits", testIOLimits},
		{"TestVolumeConditionReachesThePod", testVolumeConditionReachesThePod},
		{"TestSnapshotRestoreAndClone", testSnapshotRestoreAndClone},
		{"TestSnapshotOfRawBlock", testSnapshotOfRawBlock},
		{"TestExamples", testExamples},
		{"TestTroubleshooting", testTroubleshooting},
		// It installs local-path-provisioner beside converge for its
		// time: a namespace, a class and cluster roles of local-path's own.
		{"TestLocalPathProvisioner", testLocalPathProvisioner},
		// Issue 72's comparison, small (smokeN pods of each way, one
		// round, no time asserted): its harness provisions, starts and
		// cleans up each way. With -compare it is make compare, alone.
		{"TestCompare", testCompare},
	} {
		t.Run(q.name, func(t *testing.T) {
			if together {
				t.Parallel()
			}
			q.run(t)
		})
	}
}
