package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// releaseVersion is a release tag or a version ahead of one:
// vMAJOR.MINOR.PATCH with an optional pre-release (v0.2.0-dev).
var releaseVersion = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$`)

// coreVersion returns the major, minor and patch of v, or ok false.
func coreVersion(v string) (core [3]int, pre string, ok bool) {
	m := releaseVersion.FindStringSubmatch(v)
	if m == nil {
		return core, "", false
	}
	for i := range core {
		core[i], _ = strconv.Atoi(m[i+1])
	}
	return core, m[4], true
}

// TestVersionIsAheadOfTheLastRelease checks that the version the chart,
// the Dockerfile and deploy/ say (TestVersionsAgree holds them equal) is
// ahead of the last release, which hack/previous-release names: between
// releases main says the next version with a pre-release (v0.2.0-dev),
// so that nothing built from it is taken for a release; a release commit
// says its own version, ahead of the one before. After a release,
// hack/previous-release names it, and this fails until main says the
// next version (docs/releasing.md).
func TestVersionIsAheadOfTheLastRelease(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "hack", "previous-release"))
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			last = f[0]
			break
		}
	}
	lastCore, lastPre, ok := coreVersion(last)
	if !ok || lastPre != "" {
		t.Fatalf("hack/previous-release names %q; want a release tag vMAJOR.MINOR.PATCH", last)
	}
	app := loadChart(t).Metadata.AppVersion
	core, _, ok := coreVersion(app)
	if !ok {
		t.Fatalf("the chart's appVersion %q is not vMAJOR.MINOR.PATCH[-PRERELEASE]", app)
	}
	ahead := false
	for i := range core {
		if core[i] != lastCore[i] {
			ahead = core[i] > lastCore[i]
			break
		}
	}
	if !ahead {
		t.Errorf("the chart's appVersion %s is not ahead of the last release %s: between releases main says the next version with -dev (docs/releasing.md)", app, last)
	}
	kustomization, err := os.ReadFile(filepath.Join(deploy, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^    newTag: ` + regexp.QuoteMeta(app) + `$`).Match(kustomization) {
		t.Errorf("deploy/kustomization.yaml does not tag csi-node %s, the chart's appVersion", app)
	}
}
