package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/e2e/peers"
)

// buildTimeout bounds the whole of buildAll (-build-timeout): a cold build
// of everything takes about 20 minutes on this machine kind's 2 cores,
// beside make test's other steps.
var buildTimeout = flag.Duration("build-timeout", 45*time.Minute, "with -build-only, how long the build may take")

// buildAll builds everything the cluster and its tests run that a run would
// otherwise build (the Kubernetes binaries, the older kubelets, crictl,
// external-snapshotter, local-path-provisioner, the csi-node image's
// Debian root, the storage suite's e2e.test, the soak's Prometheus and the
// previous release's image) into the user's cache directory, or finds it
// built there, so that the tests' own timeout bounds the tests alone: make
// test's e2e build step (-build-only). Each item's line, built or cached
// and its seconds, goes to stdout and to summary when that is not "". The
// image root, which debootstrap fetches over the network, is made beside
// the compilers.
func buildAll(ctx context.Context, summary string, kubelets bool) error {
	ctx, cancel := context.WithTimeout(ctx, *buildTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "converge-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var lines []string
	report := func(line string) {
		fmt.Println("e2e build: " + line)
		lines = append(lines, line)
		if summary != "" {
			os.WriteFile(summary, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
		}
	}
	item := func(c *cluster, name string, run func(context.Context) error) error {
		start := time.Now()
		count := func() int {
			c.builtMu.Lock()
			defer c.builtMu.Unlock()
			return len(c.built)
		}
		before := count()
		if err := run(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%s: still building when the build's bound of %s ran out: %w", name, *buildTimeout, err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		state := "cached"
		if count() > before {
			state = "built "
		}
		report(fmt.Sprintf("%s %-28s %6.1fs", state, name, time.Since(start).Seconds()))
		return nil
	}
	// Two lanes: the image root (the network) beside the compilers; each
	// has a cluster value of its own, so that neither races on built.
	imaging := &cluster{repo: repoRoot(), dir: filepath.Join(dir, "image")}
	if err := os.Mkdir(imaging.dir, 0o755); err != nil {
		return err
	}
	imaged := make(chan error, 1)
	go func() { imaged <- item(imaging, "csi-node image", imaging.buildCSINodeImage) }()

	c := &cluster{repo: repoRoot(), dir: dir}
	items := []struct {
		name string
		run  func(context.Context) error
	}{
		{"kubernetes " + kubernetesVersion, c.kubeBinaries},
		{"crictl " + crictlVersion, c.buildCrictl},
		{"sidecars " + sidecarVersions(), c.buildSidecars},
		{"local-path-provisioner " + peers.LocalPathVersion, func(ctx context.Context) error { _, err := c.buildLocalPath(ctx); return err }},
		{"storage suite (e2e.test)", func(ctx context.Context) error { _, err := c.storageSuite(ctx); return err }},
		// The soak's Prometheus (prometheus.go), which make test's short
		// soak runs, from the package whose promtool its monitoring tests
		// run.
		{"prometheus (Debian's package)", func(ctx context.Context) error { _, err := c.prometheusBinary(ctx); return err }},
	}
	if kubelets {
		// make test builds them in a step of their own, beside the
		// first tests, which need none of them (-build-kubelets).
		items = append(items, struct {
			name string
			run  func(context.Context) error
		}{"kubelets " + strings.Join(olderKubeletsToRun(), ", "), c.buildOlderKubelets})
	}
	var errs []error
	for _, it := range items {
		if err := item(c, it.name, it.run); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if err := <-imaged; err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		// The previous release's image shares the image root: after it.
		// Only TestUpgradeAndRollback needs it, which fails on its own
		// when it cannot have it (a shallow clone lacks the release's
		// commit): the rest of the suite runs.
		if err := item(imaging, "previous release's image", func(ctx context.Context) error {
			r, err := readPreviousRelease(imaging.repo)
			if err == nil {
				err = releaseSource(ctx, imaging.repo, &r)
			}
			if err == nil {
				_, err = imaging.releaseImage(ctx, r)
			}
			return err
		}); err != nil {
			report(fmt.Sprintf("failed %v (TestUpgradeAndRollback will fail)", err))
		}
	}
	return errors.Join(errs...)
}

// storageSuite builds the storage suite's test binary (test/e2e/k8s/
// storagesuite) into the user's cache directory, keyed by the module's
// go.mod, go.sum and the suite's source, or finds it built there, and
// returns its path.
func (c *cluster) storageSuite(ctx context.Context) (string, error) {
	// The tests of both suites ask for it at once (TestConcurrent).
	storageSuiteMu.Lock()
	defer storageSuiteMu.Unlock()
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	module := filepath.Join(c.repo, "test", "e2e", "k8s")
	sources, err := filepath.Glob(filepath.Join(module, "storagesuite", "*.go"))
	if err != nil {
		return "", err
	}
	files := []string{"go.mod", "go.sum"}
	for _, s := range sources {
		files = append(files, filepath.Join("storagesuite", filepath.Base(s)))
	}
	sum, err := hashFiles(module, files...)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "converge-e2e", "storage-suite-"+kubernetesVersion+"-"+sum)
	bin := filepath.Join(dir, "e2e.test")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	c.builtMu.Lock()
	c.built = append(c.built, "storage suite")
	c.builtMu.Unlock()
	// Only the newest suite is kept: each is about 150 MB.
	olds, _ := filepath.Glob(filepath.Join(cache, "converge-e2e", "storage-suite-*"))
	for _, o := range olds {
		os.RemoveAll(o)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	partial := bin + ".partial"
	// -trimpath as the binaries of the same module are built
	// (buildTools), so that the two share every package they compile.
	build := exec.CommandContext(ctx, "go", "test", "-c", "-trimpath", "-o", partial, "./storagesuite")
	build.Dir = module
	if out, err := build.CombinedOutput(); err != nil {
		os.Remove(partial)
		return "", fmt.Errorf("building the storage suite: %v\n%s", err, tail(string(out), 40))
	}
	return bin, os.Rename(partial, bin)
}

// storageSuiteMu makes storageSuite one build at a time.
var storageSuiteMu sync.Mutex

// hashFiles is the first 12 hex digits of the SHA-256 of the named files
// under dir, each with its name, in the order given.
func hashFiles(dir string, names ...string) (string, error) {
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// buildKubelets builds, or finds built, the kubelets of olderKubeletsToRun
// (-build-kubelets: make test's kubelets step).
func buildKubelets(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, *buildTimeout)
	defer cancel()
	c := &cluster{repo: repoRoot()}
	start := time.Now()
	if err := c.buildOlderKubelets(ctx); err != nil {
		return err
	}
	state := "cached"
	if len(c.built) > 0 {
		state = "built "
	}
	fmt.Printf("e2e build: %s kubelets %s %.1fs\n", state, strings.Join(olderKubeletsToRun(), ", "), time.Since(start).Seconds())
	return nil
}

// lockFile takes an exclusive lock (flock) of the file at path, made if
// absent, waiting for it until ctx ends; what says, once, what is waited
// for. It returns the unlock.
func lockFile(ctx context.Context, path, what string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told {
			fmt.Printf("e2e: waiting for %s, which another process runs (%s)\n", what, path)
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("still waiting for %s (%s): %w", what, path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
