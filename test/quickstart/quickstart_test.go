// Package quickstart runs the README's quick start as written: make run in
// a copy of the repository, then the README's csi-sanity command from that
// directory, whose result must be the one the README states.
package quickstart

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// quickStartDisk is the size of the test's own disk, sparse: the
// repository's files, bin/, and the quick start's volumes above the guard.
const quickStartDisk = 8 << 30

// TestQuickStart copies the repository's files (git ls-files) into a
// directory on a filesystem of its own, runs the README's "make run"
// there, runs the README's csi-sanity command from that directory once the
// socket is up, and checks that csi-sanity's summary is the one the README
// states; then stops the plugin and checks nothing of it is left mounted.
func TestQuickStart(t *testing.T) {
	testenv.RequireRoot(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	if !regexp.MustCompile("(?m)^make run ").MatchString(text) {
		t.Fatal("the README's quick start has no make run")
	}
	sanity := ""
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "go run github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity ") {
			sanity = l
		}
	}
	want := regexp.MustCompile("`((?:SUCCESS|FAIL)! -- [^`]*)`").FindStringSubmatch(text)
	if sanity == "" || want == nil {
		t.Fatalf("the README's quick start lacks its csi-sanity command (%q) or the result it states (%q)", sanity, want)
	}

	// A fresh machine's disk, of the test's own: make run's default pool
	// is the filesystem that holds ./.run, whose guard keeps a fifth of it
	// free, and the machine's own disk may be fuller than that while other
	// tests run beside this one.
	dir := filepath.Join(t.TempDir(), "converge")
	testenv.Filesystem(t, dir, quickStartDisk, "ext4")
	files, err := exec.Command("git", "-C", "../..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join("../..", f))
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}

	run := exec.Command("make", "run")
	run.Dir = dir
	// As a fresh shell runs it: a RUN_DIR of the caller's environment, or
	// in make's own (MAKEFLAGS, of a make test RUN_DIR=...), would have
	// make run serve elsewhere than the copy's .run.
	run.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"RUN_DIR", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}, name)
	})
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var runLog bytes.Buffer
	run.Stdout, run.Stderr = &runLog, &runLog
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		syscall.Kill(-run.Process.Pid, syscall.SIGINT)
		done := make(chan struct{})
		go func() { run.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		testenv.ForceClean(dir, filepath.Join(dir, ".run", "state", "volumes"))
	})
	sock := filepath.Join(dir, ".run", "csi.sock")
	serving := func() error {
		if strings.Contains(runLog.String(), `"Serving"`) {
			return nil
		}
		if run.ProcessState != nil {
			return poll.Stop(errors.New("make run ended"))
		}
		return errors.New(`no "Serving" logged`)
	}
	if err := poll.Wait(context.Background(), 5*time.Minute, 100*time.Millisecond, serving); err != nil { // make run builds first
		t.Fatalf("make run did not serve on %s (%v):\n%s", sock, err, runLog.String())
	}

	cmd := exec.Command("sh", "-c", sanity)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PWD="+dir)
	out, err := cmd.CombinedOutput()
	summary := regexp.MustCompile(`\x1b\[[0-9;]*m`).ReplaceAllString(string(out), "")
	if !strings.Contains(summary, want[1]) {
		t.Errorf("csi-sanity (%v) does not end as the README says (%q):\n%s", err, want[1], tail(summary, 40))
	}
	t.Logf("csi-sanity: %s", lastLines(summary, 2))
	stop()
	if left := testenv.Leftovers(dir, filepath.Join(dir, ".run", "state", "volumes")); len(left) > 0 {
		t.Errorf("left behind by the quick start: %s", strings.Join(left, "; "))
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func lastLines(s string, n int) string { return strings.ReplaceAll(tail(s, n), "\n", " / ") }
