package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/test/testenv"
)

// runFailing runs csi-node with args, expects it to exit with an error
// within 20 s, and returns its output.
func runFailing(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, testenv.Binary(t), args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("csi-node %v kept running; want it to refuse to start", args)
	}
	if err == nil {
		t.Fatalf("csi-node %v exited 0; want an error", args)
	}
	return string(out)
}

func perm(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// TestSocketAndStatePolicy checks the file modes the plugin creates, that a
// second instance refuses to start (and says why) while the first holds the
// socket or the store, that a stale socket from a killed instance is
// replaced, and that an unsafe socket directory or a non-socket at the
// socket path is refused.
func TestSocketAndStatePolicy(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	for path, want := range map[string]os.FileMode{p.Socket: 0o600, p.StateDir: 0o700, p.DataDir: 0o700, filepath.Join(p.StateDir, "state.db"): 0o600, filepath.Join(p.StateDir, "state.db-wal"): 0o600} {
		if got := perm(t, path); got != want {
			t.Errorf("%s: mode %v, want %v", path, got, want)
		}
	}
	other := t.TempDir()
	base := []string{"--node-id", "n2", "--kubelet-dir", filepath.Join(other, "kubelet")}

	out := runFailing(t, append(base, "--endpoint", "unix://"+p.Socket, "--state-dir", filepath.Join(other, "state"))...)
	if !strings.Contains(out, "another instance is serving on "+p.Socket) {
		t.Errorf("second instance on the same socket said:\n%s", out)
	}
	out = runFailing(t, append(base, "--endpoint", "unix://"+filepath.Join(other, "csi.sock"), "--state-dir", p.StateDir)...)
	if !strings.Contains(out, "locked by another process") {
		t.Errorf("second instance on the same store said:\n%s", out)
	}

	// A killed instance leaves its socket; the next one replaces it.
	p.Kill()
	if _, err := os.Lstat(p.Socket); err != nil {
		t.Fatalf("the killed instance left no socket to test with: %v", err)
	}
	p.Start()

	open := filepath.Join(other, "open")
	must(t, "mkdir", os.Mkdir(open, 0o777))
	must(t, "chmod", os.Chmod(open, 0o777))
	out = runFailing(t, append(base, "--endpoint", "unix://"+filepath.Join(open, "csi.sock"), "--state-dir", filepath.Join(other, "s2"))...)
	if !strings.Contains(out, "writable by others") {
		t.Errorf("socket in a world-writable directory: said\n%s", out)
	}

	notSocket := filepath.Join(other, "file.sock")
	must(t, "file", os.WriteFile(notSocket, []byte("keep"), 0o600))
	out = runFailing(t, append(base, "--endpoint", "unix://"+notSocket, "--state-dir", filepath.Join(other, "s3"))...)
	if !strings.Contains(out, "is not a socket") {
		t.Errorf("a regular file at the socket path: said\n%s", out)
	}
	if b, err := os.ReadFile(notSocket); err != nil || string(b) != "keep" {
		t.Errorf("the file at the socket path was touched: %q, %v", b, err)
	}
}
