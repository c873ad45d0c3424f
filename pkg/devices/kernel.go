package devices

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// KernelVersion is a Linux release as major.minor: the one that brought a
// kernel feature.
type KernelVersion struct{ Major, Minor int }

// String returns "5.12".
func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// compare orders v against o as cmp.Compare does.
func (v KernelVersion) compare(o KernelVersion) int {
	return cmp.Or(cmp.Compare(v.Major, o.Major), cmp.Compare(v.Minor, o.Minor))
}

// heldBy reports whether the kernel release (uname -r: "6.18.44-fc",
// "5.8-rc1") is v or later; false when the release cannot be read.
func (v KernelVersion) heldBy(release string) bool {
	return releaseAtLeast(release, v.Major, v.Minor)
}

// KernelFeature is a system call, ioctl or field of the kernel that
// converge uses.
type KernelFeature struct {
	// Name is what the start-up error and log call it: the system call
	// or ioctl ("mount_setattr", "LOOP_CONFIGURE").
	Name string
	// Since is the release that brought it.
	Since KernelVersion
	// Required is true for a feature without which csi-node refuses to
	// start; an optional one is logged when missing.
	Required bool
	// Without says what converge does without an optional feature.
	Without string
}

// KernelError is returned by CheckKernel when the running kernel lacks
// features that converge needs. Its message names each, with the release
// that brought it, the running kernel and the minimum converge needs: a
// kernel recent enough for a feature that its probe still did not find
// (a seccomp profile or a security module refused the call) is told
// apart.
type KernelError struct {
	// Release is the running kernel's (uname -r).
	Release string
	// Missing are the required features the probes did not find, the
	// newest first.
	Missing []KernelFeature
	// Minimum is the oldest release that has every required feature.
	Minimum KernelVersion
}

func (e *KernelError) Error() string {
	var lacks, refuses []string
	for _, f := range e.Missing {
		name := fmt.Sprintf("%s (Linux %s)", f.Name, f.Since)
		if f.Since.heldBy(e.Release) {
			refuses = append(refuses, name)
		} else {
			lacks = append(lacks, name)
		}
	}
	var parts []string
	if len(lacks) > 0 {
		parts = append(parts, fmt.Sprintf("lacks %s: converge needs Linux %s or later", strings.Join(lacks, ", "), e.Minimum))
	}
	if len(refuses) > 0 {
		parts = append(parts, fmt.Sprintf("refuses %s though it is recent enough: a seccomp profile or a security module blocks the call, and csi-node must run privileged and unconfined", strings.Join(refuses, ", ")))
	}
	return fmt.Sprintf("kernel %s %s", e.Release, strings.Join(parts, "; and "))
}

// probeResult is what the probe of one feature found.
type probeResult struct {
	feature KernelFeature
	present bool
}

// judgeKernel decides from the probes' results on the kernel release:
// a *KernelError naming every required feature missing (nil when none
// is), and the optional features missing.
func judgeKernel(release string, results []probeResult) (optionalMissing []KernelFeature, err error) {
	var minimum KernelVersion
	var missing []KernelFeature
	for _, r := range results {
		f := r.feature
		if f.Required && f.Since.compare(minimum) > 0 {
			minimum = f.Since
		}
		switch {
		case r.present:
		case f.Required:
			missing = append(missing, f)
		default:
			optionalMissing = append(optionalMissing, f)
		}
	}
	if len(missing) == 0 {
		return optionalMissing, nil
	}
	slices.SortStableFunc(missing, func(a, b KernelFeature) int { return b.Since.compare(a.Since) })
	return optionalMissing, &KernelError{Release: release, Missing: missing, Minimum: minimum}
}
