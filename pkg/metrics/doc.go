// Package metrics exports what the reconciler and the gRPC server do as
// Prometheus metrics, in a registry of their own. docs/metrics.md lists
// them. It decides nothing: it counts what they report (volstatus, the
// reconciler's Recorder calls) and imports nothing else of the plugin.
package metrics
