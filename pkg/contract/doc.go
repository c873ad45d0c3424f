// Package contract is converge's published contract, in one leaf that
// imports nothing of converge's: the names a cluster writes and reads (the
// driver's name, its topology key, the StorageClass parameters and the
// volume attributes, the filesystems a volume may ask for), the rules every
// request about them follows (which keys are known, what a volume
// capability, a mount flag and an mkfs option may be), and the one rule
// for IDs (CheckID).
//
// A name here never changes: StorageClasses, PVs and alert rules in
// clusters hold it. Its rules return plain errors; the caller classifies
// them (an invalid request is INVALID_ARGUMENT), except CheckID, whose
// answer depends on the request and which says which (IDError).
// The node server, the node-local controller and converge-controller all
// import their names from here, so that no copy can drift.
package contract
