// Package reconciler makes the machine match the desired state.
//
// Each pass observes the machine once (one parse of the mount table, one
// listing of the loop devices), derives every volume's actual state from
// that snapshot in O(1), compares it with the volume's record in an explicit
// diff, and hands the first action of each volume to the executor. The
// executor runs at most one operation per volume, in two bounded pools (quick
// bind mounts and teardowns never wait behind mkfs), and backs off
// exponentially on transient failures. A terminal failure withdraws the
// intent; the next passes tear down whatever was built.
//
// The reconciler never answers RPCs: it reports through the store, where
// pkg/nodeserver waits.
package reconciler
