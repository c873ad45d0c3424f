// Package invariants holds what must be true of a whole e2e run, whatever
// its tests did, as pure checks over what the run recorded: the kubelet's
// logs, the restarts of converge's containers, the Warning events of
// converge's components, and the mount table. The e2e suite (../) applies
// them once its tests have run, with the cluster still up; this package's
// own tests plant each violation and see it caught, without a cluster.
package invariants
