package ociimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/converge-csi/converge/test/dockerfile"
)

// DebianMirror is where debootstrap and apt take Debian's packages, as
// the debian images' sources do.
const DebianMirror = "http://deb.debian.org/debian"

// debianKeyring holds the keys Debian signs its archive with (package
// debian-archive-keyring): debootstrap refuses a Release file it does not
// verify against it (--force-check-gpg), as apt does in the root after.
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// qemuName is the name binfmt_misc gives the emulator of each
// architecture a release may target (qemu-user-static, or in GitHub
// Actions docker/setup-qemu-action, registers them).
var qemuName = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}

// DebianRoot returns a tar of the final stage's root for platform p, made
// from Debian's packages as "FROM debian:<suite>-slim" and its apt-get line
// make it: debootstrap --variant=minbase, then exactly the Dockerfile's
// packages without recommends, the package lists removed. It is cached in
// cacheDir under a name made of the suite, the architecture and the
// packages (built reports a cold build, a minute or two; a warm one takes
// nothing); work holds the build's scratch root.
//
// The packages' scripts run in the root, so a platform other than this
// machine's runs them under emulation: without a binfmt_misc handler for
// its architecture, DebianRoot says so and builds nothing.
func DebianRoot(ctx context.Context, cacheDir, work string, d *dockerfile.Dockerfile, p dockerfile.Platform) (path string, built bool, err error) {
	recipe := fmt.Sprintf("debootstrap --variant=minbase --force-check-gpg --keyring=%s --arch=%s %s %s; apt-get install -y --no-install-recommends %s",
		debianKeyring, p.Arch, d.Suite, DebianMirror, strings.Join(d.Packages, " "))
	sum := sha256.Sum256([]byte(recipe))
	path = filepath.Join(cacheDir, "csi-node-root-"+d.Suite+"-"+p.Arch+"-"+hex.EncodeToString(sum[:6])+".tar")
	if _, err := os.Stat(path); err == nil {
		return path, false, nil
	}
	if err := CanBuild(p); err != nil {
		return "", false, err
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", false, fmt.Errorf("debootstrap is not installed (hack/install-deps.sh e2e installs it): %w", err)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(work, "image-root-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	// debootstrap and apt mount /proc and more inside the root: in a mount
	// namespace of their own, nothing is left mounted on the host
	// whatever happens. A slave one: what the host unmounts meanwhile goes
	// from it too, so it holds no other test's loop device open for the
	// minutes a build takes.
	private := func(script string, args ...string) error {
		cmd := exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "slave", "--", "sh", "-ec", script, "sh"}, args...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", script, err, tail(string(out), 30))
		}
		return nil
	}
	if _, err := os.Stat(debianKeyring); err != nil {
		return "", false, fmt.Errorf("Debian's archive keyring, which debootstrap checks the packages against, is not installed (hack/install-deps.sh installs debian-archive-keyring): %w", err)
	}
	if err := private(`debootstrap --variant=minbase --force-check-gpg --keyring="$1" --arch="$2" "$3" "$4" "$5"`, debianKeyring, p.Arch, d.Suite, root, DebianMirror); err != nil {
		return "", false, err
	}
	// The sources of the debian images: the suite, its updates and its
	// security fixes.
	sources := fmt.Sprintf("deb %[1]s %[2]s main\ndeb %[1]s %[2]s-updates main\ndeb http://deb.debian.org/debian-security %[2]s-security main\n", DebianMirror, d.Suite)
	if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return "", false, err
	}
	install := `mount -t proc proc "$1/proc"; chroot "$1" sh -ec 'apt-get update; shift; apt-get install -y --no-install-recommends "$@"; apt-get clean; rm -rf /var/lib/apt/lists/*' sh "$@"`
	if err := private(install, append([]string{root}, d.Packages...)...); err != nil {
		return "", false, err
	}
	partial := path + ".partial"
	tar := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial,
		"--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./run/*", "--exclude=./tmp/*", ".")
	if out, err := tar.CombinedOutput(); err != nil {
		os.Remove(partial)
		return "", false, fmt.Errorf("tar of the image root: %v\n%s", err, out)
	}
	return path, true, os.Rename(partial, path)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CanBuild says why this machine cannot build platform p's root, if it
// cannot: the root is Linux, and the packages' scripts of a platform
// other than this machine's run under an emulator that binfmt_misc must
// know.
func CanBuild(p dockerfile.Platform) error {
	if p.OS != "linux" {
		return fmt.Errorf("%s: the image is a Debian root, for Linux only", p)
	}
	if p == dockerfile.Host() {
		return nil
	}
	q, ok := qemuName[p.Arch]
	if !ok {
		return fmt.Errorf("%s: no known emulator name for %s", p, p.Arch)
	}
	if _, err := os.Stat("/proc/sys/fs/binfmt_misc/qemu-" + q); err != nil {
		return fmt.Errorf("the %s image's Debian root runs its packages' scripts as %s, and this %s machine has no emulator for it "+
			"(no binfmt_misc handler qemu-%s: install Debian's or Ubuntu's qemu-user-static, as the release workflow does)",
			p, p.Arch, dockerfile.Host(), q)
	}
	return nil
}
