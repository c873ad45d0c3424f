// Package pool owns a node's storage pools: each a data directory on a
// filesystem of its own that holds its volumes' image files and their
// snapshots' files. A Pool keeps its space: the accounting of what its
// images, the snapshots asked for and the restores under way were
// promised, its guard (the free space no promise takes), its
// overprovisioning ratio for thin volumes, and the one lock within which
// every promise is checked and every change of an image's space is made
// (Pool.Within, Promise). It makes, grows and removes images, reserves
// their holes, takes, lists and deletes snapshots, and copies a snapshot
// into a restored volume's image in the background (Restore). Pools are
// the node's set of them: which pool holds a volume (as its record says)
// or a snapshot, the pools left out at start-up, and the status of each.
// A pool this node does not have is a Missing pool, whose every call
// fails saying so.
//
// It does not own what asks for any of that: the CSI Controller service
// (pkg/controller) parses requests and answers them, and the reconciler
// (pkg/reconciler) reaches a volume's pool through a port of its own
// (reconciler.Pool), which Pool and Missing satisfy. It attaches, mounts
// and formats nothing (pkg/devices, through the reconciler), keeps no
// record of its own (the store, pkg/state, holds the volumes' records,
// which it reads and writes through Store), and answers no RPC. It builds
// on pkg/devices for the files and pkg/capacity for the accounting, and
// imports neither the controller nor the reconciler nor the node server.
package pool
