// Package driver builds converge from its configuration and runs it: the
// store, the device layer, the reconciler, the CSI Identity, Node and
// node-local Controller services, and the gRPC server on a unix socket with
// logging (secret-free) and panic-recovery interceptors.
package driver
