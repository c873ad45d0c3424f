// Package buildinfo says which build of converge runs: the version the
// build stamped into the command (-ldflags "-X main.version=..."), else
// the module's, else "devel". It owns nothing else.
package buildinfo

import "runtime/debug"

// Version returns stamped, when the build set it, else the main module's
// version, else "devel".
func Version(stamped string) string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}
