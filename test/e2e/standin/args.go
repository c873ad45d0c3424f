package standin

import (
	"errors"
	"fmt"
	"strings"
)

// flagSpec is a flag of a release that its stand-in reads: the release's
// default, which the stand-in takes when the flag is absent. Every flag a
// stand-in reads takes a string.
type flagSpec struct {
	def string
}

// args is what a stand-in was started with: the value of every flag it
// reads, as given or the release's default.
type args map[string]string

func (a args) string(name string) string { return a[name] }

// errRelease marks arguments the release itself refuses (a flag it does
// not define, a value its flag package cannot read): it exits 2 for them,
// and so does the stand-in. Any other error from parseArgs is the
// stand-in's own refusal of what the release would take.
var errRelease = errors.New("refused by the release")

// parseArgs reads argv as the release reads it, with the flags reads
// lists, which a stand-in implements: any other flag of the release is
// refused, so that no argument deploy/ passes is silently ignored. A
// flag absent takes the release's default. A value is read only as
// --name=value (the release would also take the next argument as its
// value, which the stand-in does not).
func parseArgs(release Release, reads map[string]flagSpec, argv []string) (args, error) {
	given := map[string]string{}
	for i, a := range argv {
		if bad := release.UnknownArgs([]string{a}); len(bad) > 0 {
			return nil, fmt.Errorf("%w: flag provided but not defined by %s %s: %s", errRelease, release.Image, release.Version, a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		_, ok := reads[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%s: the stand-in does not implement this flag of %s %s", a, release.Image, release.Version)
		case hasValue:
		case i+1 < len(argv):
			return nil, fmt.Errorf("%s %s: the stand-in reads --%s=value only", a, argv[i+1], name)
		default:
			return nil, fmt.Errorf("%w: flag needs an argument: %s", errRelease, a)
		}
		given[name] = value
	}
	out := args{}
	for name, spec := range reads {
		value, ok := given[name]
		if !ok {
			value = spec.def
		}
		out[name] = value
	}
	return out, nil
}
