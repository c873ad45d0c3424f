package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// chartDocsRecipe is make chart-docs' command: helm-docs with the module
// cache as the first proxy, then GOPROXY's, so that it runs offline once
// the cache holds helm-docs (go run pkg@version looks up the module's
// latest version even then), with GOPROXY=off too.
const chartDocsRecipe = "\nchart-docs:\n\t" +
	`GOPROXY="file://$$($(GO) env GOMODCACHE)/cache/download|$$($(GO) env GOPROXY)" $(GO) run $(HELM_DOCS) $(HELM_DOCS_ARGS)` + "\n"

// helmDocs returns the helm-docs package at its pinned version and the
// arguments make chart-docs runs it with, read from the Makefile's
// HELM_DOCS and HELM_DOCS_ARGS, so that the test and the target cannot
// differ; it fails if the target's command is not chartDocsRecipe.
func helmDocs(t *testing.T) (pkg string, args []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	makefile := string(b)
	variable := func(name string) string {
		m := regexp.MustCompile(`(?m)^`+name+`\s*:=\s*(.+)$`).FindAllStringSubmatch(makefile, -1)
		if len(m) != 1 || strings.ContainsAny(m[0][1], `$"'\`) {
			t.Fatalf("the Makefile sets %s %d times, want once, to plain words: %q", name, len(m), m)
		}
		return strings.TrimSpace(m[0][1])
	}
	pkg, args = variable("HELM_DOCS"), strings.Fields(variable("HELM_DOCS_ARGS"))
	if !strings.Contains(makefile, chartDocsRecipe) {
		t.Fatalf("make chart-docs does not run what the test runs:%s", chartDocsRecipe)
	}
	return pkg, args
}

// TestChartReadmeIsCurrent generates the chart's README as make
// chart-docs does, with the same helm-docs and arguments, from a copy of
// the chart in a directory of the test's own, and checks that
// charts/converge/README.md is that, and that every value in its table
// has a description. The first run downloads helm-docs through the Go
// module proxy; later runs build it from the module cache, offline too.
func TestChartReadmeIsCurrent(t *testing.T) {
	pkg, args := helmDocs(t)
	root := t.TempDir()
	copied := filepath.Join(root, "charts", "converge")
	if err := os.CopyFS(copied, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	// helm-docs warns and exits 0 when it cannot render: no README
	// then, rather than the checked-in one, and its warnings shown.
	if err := os.Remove(filepath.Join(copied, "README.md")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	env, err := exec.Command("go", "env", "GOPROXY", "GOMODCACHE").Output()
	goproxy, modcache, ok := strings.Cut(strings.TrimSpace(string(env)), "\n")
	if err != nil || !ok {
		t.Fatalf("go env GOPROXY GOMODCACHE: %v: %q", err, env)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("go", append([]string{"run", pkg}, args...)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &stderr, &stderr
	cmd.Env = append(os.Environ(), "GOPROXY=file://"+modcache+"/cache/download|"+goproxy)
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run %s %s: %v\n%s", pkg, strings.Join(args, " "), err, stderr.String())
	}
	if regexp.MustCompile(`level=(warning|error|fatal)`).Match(stderr.Bytes()) {
		t.Fatalf("helm-docs warned:\n%s", stderr.String())
	}
	want, err := os.ReadFile(filepath.Join(copied, "README.md"))
	if err != nil {
		t.Fatalf("helm-docs wrote no README: %v\n%s", err, stderr.String())
	}
	got, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")); diff != "" {
		t.Errorf("charts/converge/README.md is not what helm-docs generates from values.yaml and README.md.gotmpl; run make chart-docs (-generated +checked in):\n%s", diff)
	}
	rows := 0
	for _, line := range strings.Split(string(want), "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) != 4 || !strings.HasPrefix(line, "| ") || cells[0] == "| Key" {
			continue
		}
		rows++
		if strings.TrimSpace(strings.TrimSuffix(cells[3], "|")) == "" {
			t.Errorf("value %s has no description: give it a \"# --\" comment in values.yaml (its first line with no other \" --\")", strings.TrimPrefix(cells[0], "| "))
		}
	}
	if rows == 0 {
		t.Error("the generated README has no values table")
	}
}
