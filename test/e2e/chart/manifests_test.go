package chart

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/converge-csi/converge/test/e2e/manifests"
)

// TestDeployIsGenerated fails while deploy/ is not what make manifests
// generates from the chart: a file edited by hand, a chart change without
// make manifests, a generated file missing or one left over, a
// kustomization.yaml that holds more than the glue or does not list
// exactly the files generated beside it, or a kustomize build of deploy/,
// in any combination of its components, that is not the chart's objects
// with those components on (manifests.Generate checks all of it). The chart is the one source of what converge installs; deploy/ is
// its rendering for kubectl apply -k.
func TestDeployIsGenerated(t *testing.T) {
	files, err := manifests.Generate(chartDir, deploy)
	if err != nil {
		t.Fatalf("%v\nrun make manifests, or fix the kustomization", err)
	}
	diffs, err := manifests.Check(deploy, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		switch {
		case d.Got == nil:
			t.Errorf("deploy/%s is missing: run make manifests", d.Path)
		case d.Want == nil:
			t.Errorf("deploy/%s is not generated from the chart: delete it, or put its objects into the chart and run make manifests", d.Path)
		default:
			t.Errorf("deploy/%s is not what make manifests generates: change the chart, not deploy/, and run make manifests (-deploy/ +generated):\n%s",
				d.Path, cmp.Diff(strings.Split(string(d.Got), "\n"), strings.Split(string(d.Want), "\n")))
		}
	}
}
