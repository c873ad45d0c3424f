// Package e2e runs converge under a real kubelet: a cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) on 127.0.0.1
// with one node (kubelet and containerd in namespaces of their own), on
// which converge is installed as users install it: kubectl apply -k of
// deploy/, its csi-node image built from the Dockerfile, csi-provisioner,
// csi-resizer and csi-snapshotter built from their releases (sidecars.go),
// node-driver-registrar a stand-in of its own name that takes deploy/'s
// arguments (daemonset.go). Real pods with PersistentVolumeClaims use it. The
// two-node tests join a second node (join.go), on which the DaemonSet
// puts a pod of its own. TestHelmChart installs the Helm chart in place
// of the kustomization, through the Helm SDK, and puts the kustomization
// back. The cluster lives in one temporary directory and is taken down
// afterwards, leaving the machine as it was.
package e2e
