package e2e

import (
	"bufio"
	"context"
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	storageSuite  = flag.String("storage-suite", "", `run the Kubernetes storage suite's External Storage tests against converge: "" none, "parallel" those that need no disruption nor serial execution, "all" every applicable one`)
	storageFocus  = flag.String("storage-focus", "", "a regexp that narrows the External Storage tests further (for development)")
	storageReport = flag.String("storage-report", "", "where to keep the External Storage tests' JUnit report (default: the run's directory, removed with it)")
)

// TestExternalStorage runs the External Storage tests of the Kubernetes
// release's storage e2e suite (k8s.io/kubernetes/test/e2e/storage/external)
// against converge on this cluster, driven by storage/converge.yaml, less
// the tests storage/skip.txt names with the reason they cannot run here.
// It prints, per testsuite, how many tests ran, passed and were skipped, and
// fails on any failure.
func TestExternalStorage(t *testing.T) {
	if *storageSuite == "" {
		t.Skip("the External Storage tests run with -storage-suite=parallel or all (make conformance)")
	}
	skips, err := readSkips(filepath.Join(c.repo, "test", "e2e", "storage", "skip.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if *storageSuite == "parallel" {
		skips = append(skips, skip{`\[Serial\]`, "runs alone"}, skip{`\[Disruptive\]`, "disrupts the node"})
	}
	patterns := make([]string, len(skips))
	for i, s := range skips {
		patterns[i] = "(" + s.pattern + ")"
	}
	bin := filepath.Join(c.dir, "e2e.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "./storagesuite")
	build.Dir = filepath.Join(c.repo, "test", "e2e", "k8s")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the suite: %v\n%s", err, out)
	}
	report := filepath.Join(c.dir, "storage-junit.xml")
	if *storageReport != "" {
		report, _ = filepath.Abs(*storageReport)
	}
	focus := `External Storage \[Driver: converge\.csi\.dev\]`
	if *storageFocus != "" {
		focus += ".*(" + *storageFocus + ")"
	}
	// The suite's own flags; ginkgo's go to the runner, which starts
	// storageProcs processes of the suite: most of a test's time is spent
	// waiting for pods and volumes, not on the two cores. [Serial] tests
	// run alone at the end.
	args := []string{
		"--procs=" + strconv.Itoa(storageProcs),
		"--focus=" + focus,
		"--skip=" + strings.Join(patterns, "|"),
		"--junit-report=" + report,
		"--no-color",
		"--timeout=150m",
		bin, "--",
		"--kubeconfig=" + c.admin,
		"--repo-root=" + c.repo,
		"--storage.testdriver=" + filepath.Join(c.repo, "test", "e2e", "storage", "converge.yaml"),
		"--report-dir=" + filepath.Join(c.dir, "storage-report"),
		"--node-os-distro=debian",
		"--allowed-not-ready-nodes=0",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 160*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "ginkgo"), args...)
	log, err := os.Create(filepath.Join(c.logs, "storage-suite.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("the suite ran %.0fs; its log is %s", time.Since(start).Seconds(), log.Name())
	counts, failed, err := readJUnit(report)
	if err != nil {
		t.Fatalf("reading the suite's report: %v (the suite: %v)\n%s", err, runErr, tailFile(log.Name(), 60))
	}
	t.Logf("External Storage tests per testsuite:\n%s", counts)
	for _, f := range failed {
		t.Errorf("FAILED: %s", f)
	}
	if runErr != nil && len(failed) == 0 {
		t.Errorf("the suite failed: %v\n%s", runErr, tailFile(log.Name(), 60))
	}
}

// storageProcs is how many processes of the suite run its tests at once.
const storageProcs = 6

// skip is one entry of the skip list: tests that cannot run on this machine
// kind, and why.
type skip struct{ pattern, reason string }

// readSkips reads the skip list: each entry is a line holding a regexp of
// test names, preceded by comment lines (#) that give the reason.
func readSkips(path string) ([]skip, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []skip
	var reason []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			reason = nil
		case strings.HasPrefix(line, "#"):
			reason = append(reason, strings.TrimSpace(strings.TrimPrefix(line, "#")))
		default:
			if len(reason) == 0 {
				return nil, fmt.Errorf("%s: %q has no reason", path, line)
			}
			if _, err := regexp.Compile(line); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			out = append(out, skip{line, strings.Join(reason, " ")})
		}
	}
	return out, sc.Err()
}

// junitSuite is the part of a JUnit report the summary needs.
type junitSuite struct {
	Cases []struct {
		Name    string `xml:"name,attr"`
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
		Failure *struct {
			Message string `xml:"message,attr"`
		} `xml:"failure"`
		Error *struct {
			Message string `xml:"message,attr"`
		} `xml:"error"`
	} `xml:"testsuite>testcase"`
}

// testsuiteOf names the storage testsuite of an External Storage test: the
// first word after the bracketed driver, test pattern and tags.
var testsuiteOf = regexp.MustCompile(`^(?:\[\w+\] )?External Storage \[Driver: [^\]]*\](?: \[[^\]]*\])* (\S+)`)

// readJUnit counts the tests of each testsuite that ran, passed and were
// skipped, and lists the failed ones.
func readJUnit(path string) (string, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	var r junitSuite
	if err := xml.Unmarshal(b, &r); err != nil {
		return "", nil, err
	}
	type count struct{ ran, passed, skipped int }
	counts := map[string]*count{}
	var failed []string
	for _, tc := range r.Cases {
		m := testsuiteOf.FindStringSubmatch(tc.Name)
		if m == nil {
			continue // the suite's set-up and reports
		}
		cn := counts[m[1]]
		if cn == nil {
			cn = &count{}
			counts[m[1]] = cn
		}
		switch {
		case tc.Skipped != nil && tc.Skipped.Message == "skipped":
			// Left out by the focus or the skip list: not counted.
		case tc.Skipped != nil:
			cn.skipped++ // by the suite itself, which says why
		case tc.Failure != nil || tc.Error != nil:
			cn.ran++
			failed = append(failed, tc.Name)
		default:
			cn.ran++
			cn.passed++
		}
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	slices.Sort(names)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-28s %5s %7s %8s\n", "testsuite", "ran", "passed", "skipped")
	for _, n := range names {
		cn := counts[n]
		fmt.Fprintf(&sb, "%-28s %5d %7d %8d\n", n, cn.ran, cn.passed, cn.skipped)
	}
	return sb.String(), failed, nil
}
