// Package runs owns an e2e run's identity on the machine and its clean-up.
// A run is a directory in the temporary directory (New), whose owner file
// names the process that runs it; every object the run makes outside its
// processes is named after that directory (the cgroup roots of its
// kubelets, CgroupRoot) or lies under it (mounts, images behind loop
// devices, the daemons' binaries and sockets), so that one run's clean-up
// (Clean) finds its own objects and nothing of another's, and a later run
// (CleanStale) finds and removes what a run killed before it could take
// itself down left, even once its directory is gone. A live run's node
// that reboots loses what a machine loses with its power (poweroff.go):
// its loop devices and cgroups. The e2e suite (../) calls it at the start
// and at the end of a run; its own test builds what a killed run leaves,
// without a cluster.
package runs
