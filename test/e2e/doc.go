// Package e2e runs converge under a real kubelet: a cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1
// with one node (kubelet and containerd in namespaces of their own),
// csi-node as a host process registered with the kubelet through the
// plugin-registration protocol, and real pods with PersistentVolumeClaims.
// The two-node tests join a second node (join.go) with its own kubelet,
// containerd, csi-node and data directory. The cluster lives in one
// temporary directory and is taken down afterwards, leaving the machine as
// it was.
package e2e
