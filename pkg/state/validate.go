package state

import (
	"fmt"
)

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
