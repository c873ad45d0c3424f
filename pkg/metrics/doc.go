// Package metrics exports what the reconciler and the gRPC server do as
// Prometheus metrics, in a registry of their own. docs/metrics.md lists
// them.
package metrics
