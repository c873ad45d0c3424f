// Package locks is the one place converge's mutexes come from. A plain
// build gives sync's; a test build with the tag lockorder gives
// go-deadlock's, which record the order in which each goroutine takes
// them and stop the run when two are ever taken in both orders, however
// rarely the two orders would meet and deadlock. The rank of every
// mutex, the order in which they may be held together, is
// docs/architecture.md's table "Locks".
package locks
