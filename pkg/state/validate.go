package state

import (
	"fmt"
)

// MaxIDLength is the longest volume ID or name; CSI's limit for strings
// that serve as identifiers.
const MaxIDLength = 128

// ValidID checks that id may name a volume: 1 to MaxIDLength bytes of
// [A-Za-z0-9._-], not starting with a dot (so never "." or ".." and never a
// hidden file in the data directory).
func ValidID(id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("volume ID must be 1 to %d bytes long, got %d", MaxIDLength, len(id))
	}
	if id[0] == '.' {
		return fmt.Errorf("volume ID %q must not start with a dot", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("volume ID %q may only hold letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// LookupID checks the ID of a volume or snapshot a request looks up
// (what names which): INVALID_ARGUMENT when there is none, NOT_FOUND when
// it is not one ValidID accepts, since nothing was ever made under it. A
// request that makes or changes something under an ID refuses an invalid
// one instead (ValidID, INVALID_ARGUMENT).
func LookupID(what, id string) error {
	if id == "" {
		return Errorf(KindInvalidArgument, "%s ID is required", what)
	}
	if ValidID(id) != nil {
		return Errorf(KindNotFound, "%s %s not found", what, id)
	}
	return nil
}

// DefaultPool is the storage pool of a volume whose record names none: the
// data directory of --data-dir.
const DefaultPool = "default"

// maxPoolName is the longest pool name: a DNS label, so that a pool can
// name a Kubernetes object or label value as it is.
const maxPoolName = 63

// ValidPoolName checks that name may name a storage pool: 1 to 63 bytes
// of lower-case letters, digits and '-', starting and ending with a letter
// or digit (a DNS label).
func ValidPoolName(name string) error {
	if name == "" || len(name) > maxPoolName {
		return fmt.Errorf("pool name must be 1 to %d bytes long, got %d", maxPoolName, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(name)-1) {
			return fmt.Errorf("pool name %q must be lower-case letters, digits and '-', starting and ending with a letter or digit", name)
		}
	}
	return nil
}

// PoolOf is the pool of volume v: its record's, else the default.
func PoolOf(v *Volume) string {
	if v == nil || v.Pool == "" {
		return DefaultPool
	}
	return v.Pool
}
