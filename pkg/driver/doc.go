// Package driver builds converge from its configuration and runs it: the
// store, the device layer, the reconciler, the CSI Identity, Node and
// node-local Controller services, and the gRPC server on a unix socket with
// logging (secret-free) and panic-recovery interceptors. Run starts it in
// three steps: construct (construct.go) builds everything once, recover
// (recover.go) repairs what the last run left on disk, in order, and serve
// (serve.go) runs the reconciler, the mount watcher, gRPC and HTTP as one
// group with one shutdown. It decides nothing about a volume and mounts
// nothing: the services and the reconciler it builds do.
package driver
