package contract

import (
	"fmt"
	"slices"
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
)

// CheckKeys refuses, naming them in order, the keys of m (what: "parameters"
// or "volume attributes") that are neither known nor added by Kubernetes
// itself (kubernetesPrefixes), INVALID_ARGUMENT, so that a typo in a StorageClass, a
// VolumeSnapshotClass or a PV is never silently ignored. No map, or one of
// known keys only, is nil.
func CheckKeys(what string, m map[string]string, known ...string) error {
	var unknown []string
	for k := range m {
		if !slices.Contains(known, k) && !slices.ContainsFunc(kubernetesPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return classified.Errorf(classified.KindInvalidArgument, "unknown %s: %s", what, strings.Join(unknown, ", "))
	}
	return nil
}
