// Package reconciler makes the machine match the desired state. It owns
// the actual state of each volume (observed, never stored), the decisions
// made from it (diff, health) and the operations that act on them; it
// does not own the records (pkg/state) nor touch the OS but through the
// interfaces of config.go (pkg/devices and the pools fill them).
//
// Each pass observes the machine once (one parse of the mount table, one
// listing of the loop devices), derives every volume's actual state from
// that observation in O(1), compares it with the volume's record in an explicit
// diff, and hands the first action of each volume to the executor. The
// executor runs at most one operation per volume, in two bounded pools (quick
// bind mounts and teardowns never wait behind mkfs), and backs off
// exponentially on transient failures. A terminal failure withdraws the
// intent; the next passes tear down whatever was built.
//
// The reconciler never answers RPCs: it reports through the store, where
// pkg/nodeserver waits.
//
// One idea per file: reconciler.go is the loop (Run, kicks); pass.go one
// pass (observe, plan, report, start); pools.go resolves each volume's
// storage pool once a pass (config.go's Pool: every call about its image
// and snapshots goes there); observe.go what a volume's actual
// state is, from the machine's observation; diff.go the rules that compare it
// with the record and choose actions; kinds.go the table of action kinds;
// dispatch.go takes a volume for an action through its claim (package
// claim: one operation per volume, for a pass and an early start alike)
// and hands it to the executor (executor.go); early.go is a request's
// early start; and
// outcome.go does what its end calls for; health.go decides a volume's
// condition (the one place it is decided: the node server, the metrics
// and the status page only read it), and report.go publishes it with each
// intent's result. The operations are in stage.go, publish.go,
// unstage.go, expand.go and snapshot.go (a snapshot's copy runs under
// frozen), with record.go (store writes that follow the kernel) and errors.go (how
// their failures are classified).
package reconciler
