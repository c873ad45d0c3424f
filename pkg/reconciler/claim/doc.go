// Package claim keeps at most one operation per volume at a time, whoever
// starts it: the reconciler's full pass and a request's early start take
// a volume only through a Set.
//
// A claim also tells whether an observation is still good to act on: the
// Set counts released claims, and a caller reads that count (Epoch)
// before it observes; a volume whose claim was released since acted after
// that observation, which must not be acted on (it would redo what the
// operation just did). Backoff is not the claim's: it is kept per action,
// in the reconciler's vocabulary, by its executor.
package claim
