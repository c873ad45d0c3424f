// Package state holds the desired state of the node: one durable record per
// volume (what the kubelet asked for) and the in-memory results the
// reconciler reports for each intent. It does not hold the actual state:
// the machine is observed anew every pass (pkg/host's Observation, filled
// by pkg/devices). A record whose Stage is set asks for a stage; whether
// it is in place is the reconciler's observation, and whether it is ready
// its decision.
//
// A record is durable once it is in the store's write-ahead log (one write
// and one fdatasync); bbolt takes the log's records at checkpoints, and Open
// replays what came after the last one (see writeLog).
//
// A record changes only through its named transitions, inside
// Store.Update: a Node request's (requests.go: the intent it makes, or the
// classified error that refuses it) and the reconciler's once an operation
// has ended (transitions.go).
//
// The package knows intents and nothing of gRPC, the OS or CSI codes: its
// errors are classified ones (pkg/classified), whose Kind pkg/rpcerr maps
// to a gRPC code in one place; a volume without a record is NotFound,
// which wraps ErrNotFound.
package state
