// Package reasons is the published part of a volume's condition: Reason,
// the short CamelCase cause of an abnormal condition, its values and All,
// the list of them. The kubelet copies a reason into the pod's
// status.volumeHealth, the converge_volume_conditions metric counts
// volumes by it, csi-node status prints it, and the alert rules
// (deploy/components/monitoring, charts/converge/files/alerts.yaml) and
// docs/operations.md match it, so a value never changes.
//
// It belongs to the published contract (pkg/contract), as its own leaf
// that imports nothing: the store (pkg/state) carries a reason in a
// volume's Condition, and the reconciler, which decides it, reads the
// reasons without the request rules. Which reason a volume has is decided in
// one place, pkg/reconciler's health.go (and, for a filesystem found gone,
// state.LostFilesystem).
package reasons
