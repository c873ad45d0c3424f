// Package httpserve holds the one way converge serves HTTP on an address
// the pod network reaches (csi-node's probes and metrics, the
// converge-controller's): each connection bounded in time and its headers
// in size, and a server that stops serving reported as a failure of the
// process rather than left behind it. It imports nothing of converge.
package httpserve
