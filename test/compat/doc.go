// Package compat calls every RPC of the real csi-node binary through a
// client built as the oldest peers converge supports are built: CSI spec
// v1.11.0 and csi-lib-utils v0.20.0, the versions of csi-provisioner v5.2
// and csi-resizer v1.13. Each reply must decode into that spec's types and
// render through that release's protosanitizer, as the sidecars log every
// reply. It is a module of its own because one build holds one version of
// the spec: converge is built on a newer one.
package compat
