// Package classified holds the plugin's classified errors: Error, a
// failure with a Kind (how the CSI answer must classify it), a Terminal
// flag (the reconciler withdraws a terminal failure's intent instead of
// retrying it) and the causes errors.Is and errors.As see through. Every
// layer answers with them: the published request rules (pkg/contract), the
// store and its transitions (pkg/state), the reconciler, the node server
// and the node-local controller. pkg/rpcerr maps each Kind to the gRPC
// code of the same name, in one table.
//
// It is a leaf: it imports nothing of converge, so that the published
// contract, and converge-controller through it, can answer with classified
// errors without linking the store.
package classified
