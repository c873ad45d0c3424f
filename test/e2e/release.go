package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// The previous release, which the upgrade tests (upgrade_test.go) install
// and upgrade from: hack/previous-release names its tag and the commit it
// was cut from; its csi-node image is built from that commit's own source,
// and its deploy/ and chart are that commit's.

// previousReleaseFile names the previous release; the release procedure
// updates it.
const previousReleaseFile = "hack/previous-release"

// convergeRelease is a converge release: its tag, the commit it was cut from, and
// once fetched (releaseSource) the directory that holds that commit's tree.
type convergeRelease struct {
	tag, commit string
	src         string
}

var (
	// A tag is also csi-node's image tag here: what an image tag allows.
	releaseTagRE    = regexp.MustCompile(`^v[0-9][A-Za-z0-9._-]{0,126}$`)
	releaseCommitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// readPreviousRelease reads the repository's previousReleaseFile: one line
// "<tag> <full commit>" besides comments and blank lines.
func readPreviousRelease(repo string) (convergeRelease, error) {
	path := filepath.Join(repo, previousReleaseFile)
	f, err := os.Open(path)
	if err != nil {
		return convergeRelease{}, err
	}
	defer f.Close()
	var found []convergeRelease
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 || !releaseTagRE.MatchString(fields[0]) || !releaseCommitRE.MatchString(fields[1]) {
			return convergeRelease{}, fmt.Errorf("%s: %q is not \"<tag> <full commit>\" (a tag like v0.1.0, 40 lower-case hex digits)", previousReleaseFile, line)
		}
		found = append(found, convergeRelease{tag: fields[0], commit: fields[1]})
	}
	if err := s.Err(); err != nil {
		return convergeRelease{}, err
	}
	if len(found) != 1 {
		return convergeRelease{}, fmt.Errorf("%s names %d releases, want one", previousReleaseFile, len(found))
	}
	return found[0], nil
}

// releaseCacheDir is where a release's source and image are kept across
// runs, keyed by its commit: the user's cache directory, as the Kubernetes
// binaries and the image root are.
func releaseCacheDir(r convergeRelease) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "converge-e2e", "release-"+r.tag+"-"+r.commit), nil
}

// releaseSource extracts the tree of r's commit from the repository
// (git archive) into the cache, once, and sets r.src to it. A commit that
// the clone lacks is an error that says how to fetch it.
func releaseSource(ctx context.Context, repo string, r *convergeRelease) error {
	dir, err := releaseCacheDir(*r)
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", repo, "cat-file", "-e", r.commit+"^{commit}").CombinedOutput(); err != nil {
		return fmt.Errorf("commit %s of release %s (%s) is not in the clone at %s (%v: %s): fetch it, with its tag, "+
			"`git fetch origin tag %s` (or `git fetch --unshallow` in a shallow clone), then run again",
			r.commit, r.tag, previousReleaseFile, repo, err, strings.TrimSpace(string(out)), r.tag)
	}
	// The test builds and runs the release's code as root, and applies
	// its deploy/ and chart: only code that was once main's, never an
	// object that merely exists in the clone (a pull request's, say).
	if out, err := exec.CommandContext(ctx, "git", "-C", repo, "merge-base", "--is-ancestor", r.commit, "HEAD").CombinedOutput(); err != nil {
		return fmt.Errorf("commit %s of release %s (%s) is not in the history of HEAD (%v %s): a release is cut from main, so %s must name one of its commits",
			r.commit, r.tag, previousReleaseFile, err, strings.TrimSpace(string(out)), previousReleaseFile)
	}
	// A clone that has the tag must agree with the file.
	if out, err := exec.CommandContext(ctx, "git", "-C", repo, "rev-parse", "--verify", "-q", "refs/tags/"+r.tag+"^{commit}").Output(); err == nil {
		if got := strings.TrimSpace(string(out)); got != r.commit {
			return fmt.Errorf("tag %s is commit %s, but %s names %s: one of them is wrong", r.tag, got, previousReleaseFile, r.commit)
		}
	}
	src := filepath.Join(dir, "src")
	if _, err := os.Stat(filepath.Join(src, "go.mod")); err == nil {
		r.src = src
		return nil
	}
	// Only one previous release is named at a time: the caches of
	// others (about 260 MB each, mostly the image) go.
	others, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "release-*"))
	for _, o := range others {
		if o != dir {
			os.RemoveAll(o)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// git archive writes the commit's tree, nothing of the work tree.
	script := `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`
	if out, err := exec.CommandContext(ctx, "sh", "-ec", script, "sh", repo, r.commit, tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive of %s: %v\n%s", r.commit, err, out)
	}
	if err := os.Rename(tmp, src); err != nil {
		return err
	}
	r.src = src
	return nil
}

// releaseImage builds r's csi-node image from its source, as the run
// builds its own (writeCSINodeImage), named csiNodeImageName:<tag>, into
// the cache, once, and returns the OCI archive. A cold build takes what
// building the two binaries takes (the image root is shared when the
// Dockerfile's packages are the same), a warm one nothing.
func (c *cluster) releaseImage(ctx context.Context, r convergeRelease) (string, error) {
	dir, err := releaseCacheDir(r)
	if err != nil {
		return "", err
	}
	image := filepath.Join(dir, "csi-node-image.tar")
	if _, err := os.Stat(image); err == nil {
		return image, nil
	}
	c.built = append(c.built, "csi-node "+r.tag)
	work, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	start := time.Now()
	partial := filepath.Join(work, "image.tar")
	if err := c.writeCSINodeImage(ctx, r.src, r.tag, work, partial); err != nil {
		return "", fmt.Errorf("building csi-node %s from %s: %w", r.tag, r.commit, err)
	}
	if err := os.Rename(partial, image); err != nil {
		return "", err
	}
	fmt.Printf("e2e: built csi-node %s from commit %s in %.1fs (cached in %s)\n", r.tag, r.commit, time.Since(start).Seconds(), dir)
	return image, nil
}

// previousRelease fetches the previous release's source, builds its
// csi-node image and imports it into every node's containerd as
// csiNodeImageName:<tag>.
func (c *cluster) previousRelease(ctx context.Context) (convergeRelease, error) {
	r, err := readPreviousRelease(c.repo)
	if err != nil {
		return r, err
	}
	if err := releaseSource(ctx, c.repo, &r); err != nil {
		return r, err
	}
	image, err := c.releaseImage(ctx, r)
	if err != nil {
		return r, err
	}
	for _, n := range c.nodes {
		if out, err := n.ctr("images", "import", image); err != nil {
			return r, fmt.Errorf("importing csi-node %s into %s's containerd: %v: %s", r.tag, n.node, err, out)
		}
	}
	return r, nil
}
