// Package e2e runs converge under a real kubelet: a single-node cluster
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
// containerd) on 127.0.0.1, csi-node as a host process registered with the
// kubelet through the plugin-registration protocol, and real pods with
// PersistentVolumeClaims. The cluster lives in one temporary directory and
// is taken down afterwards, leaving the machine as it was.
package e2e
