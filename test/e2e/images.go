package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/ociimage"
	"github.com/converge-csi/converge/test/e2e/soak"
	"github.com/converge-csi/converge/test/e2e/standin"
)

// The images the cluster runs. No registry is reachable, so they are built
// here and imported into containerd; our own pods use imagePullPolicy
// Never.
const (
	pauseImage   = "converge.local/pause:e2e"
	busyboxImage = "converge.local/busybox:e2e"
	// toolsImage is busybox's shell tools with GNU dd and bash as sh.
	toolsImage = "converge.local/e2e-tools:e2e"
	// fioImage is toolsImage with the host's fio (TestIOLimits), an image
	// of its own: fio's libraries weigh 80 MB, which the storage suite's
	// pods of toolsImage do without.
	fioImage = "converge.local/e2e-fio:e2e"
	// soakImage runs the test binary as the soak's writer (TestSoak).
	soakImage = "converge.local/e2e-soak:e2e"
)

// standInBinary is where the stand-ins' images hold the test binary.
const standInBinary = "e2e-sidecar"

// standInImage is the image of the stand-in for a sidecar release
// (package standin), under a name of its own:
// converge.local/e2e-<name>:<version>.
func standInImage(s standin.Release) string {
	return "converge.local/e2e-" + filepath.Base(s.Image) + ":" + s.Version
}

// upstreamTags are the names under which the Kubernetes storage suite
// (test/utils/image/manifest.go of the release), and docs/examples, ask
// for each of our images. Their pods pull IfNotPresent, so they find these
// here.
var upstreamTags = map[string][]string{
	busyboxImage: {"docker.io/library/busybox:1.37"},
	pauseImage:   {"registry.k8s.io/pause:3.10.2"},
	// The shell tools of busybox, with GNU dd (multiVolume uses
	// oflag=nocache and iflag=direct, which busybox's dd lacks), bash as
	// the shell and the C library they need. The suite only runs shell commands in the glibc
	// and nginx images.
	toolsImage: {
		"registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
		"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
		"registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
		"registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
	},
	"converge.local/agnhost:e2e": {"registry.k8s.io/e2e-test-images/agnhost:2.66.1"},
}

// kubectlImage runs the release's kubectl in a pod: in-cluster, it finds
// the API server and its credentials as the sidecars of deploy/ do.
const kubectlImage = "converge.local/kubectl:e2e"

// buildImages writes OCI archives of the images into dir, imports them into
// containerd's k8s.io namespace and tags them with their upstream names.
// agnhost and kubectl are the binaries built from the Kubernetes release;
// sidecarBin gives the path of each sidecar of sidecars, built from its
// release, whose image is named as deploy/ names it; the registrar's
// stand-in is this test binary (package standin).
func buildImages(dir, containerdSock, agnhost, kubectl string, sidecarBin func(name string) string) error {
	pause := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", pause, "./images/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build pause: %v: %s", err, out)
	}
	bin, err := os.ReadFile(pause)
	if err != nil {
		return err
	}
	shell, err := busyboxFiles(nil)
	if err != nil {
		return err
	}
	// busybox's sh runs its own applets before any program of PATH, so the
	// shell of these images is Debian's bash, which runs GNU dd and, unlike
	// dash, has the let builtin that the suite's scripts use.
	tools, err := busyboxFiles(map[string]string{"/bin/dd": "/bin/dd", "/bin/sh": "/bin/bash"})
	if err != nil {
		return err
	}
	fio, err := exec.LookPath("fio")
	if err != nil {
		return fmt.Errorf("fio is not installed (hack/install-deps.sh e2e installs it): %w", err)
	}
	fioFiles, err := busyboxFiles(map[string]string{"/bin/dd": "/bin/dd", "/bin/sh": "/bin/bash", "/bin/fio": fio})
	if err != nil {
		return err
	}
	agn, err := busyboxFiles(map[string]string{"/bin/dd": "/bin/dd", "/bin/sh": "/bin/bash", "/agnhost": agnhost})
	if err != nil {
		return err
	}
	kctl, err := busyboxFiles(map[string]string{"/bin/kubectl": kubectl})
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	standInFiles, err := busyboxFiles(map[string]string{"/" + standInBinary: self})
	if err != nil {
		return err
	}
	standInBase, err := ociimage.Layer(standInFiles)
	if err != nil {
		return err
	}
	// agnhost's PATH is its upstream image's (alpine's), not /bin: the
	// suite's HostExec pods run it on the node after nsenter, where
	// programs such as crictl live in /usr/local/sbin (node.go
	// installCrictl).
	const agnhostPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	type image struct {
		ref    string
		lower  []byte // a layer below files', or nil
		files  []ociimage.File
		config map[string]any
	}
	images := []image{
		{ref: pauseImage, files: []ociimage.File{{Name: "pause", Mode: 0o755, Data: bin}}, config: map[string]any{"Entrypoint": []string{"/pause"}}},
		{ref: busyboxImage, files: shell, config: map[string]any{"Cmd": []string{"sh"}, "Env": []string{"PATH=/bin"}}},
		{ref: toolsImage, files: tools, config: map[string]any{"Cmd": []string{"sh"}, "Env": []string{"PATH=/bin"}}},
		{ref: fioImage, files: fioFiles, config: map[string]any{"Cmd": []string{"sh"}, "Env": []string{"PATH=/bin"}}},
		{ref: "converge.local/agnhost:e2e", files: agn,
			config: map[string]any{"Entrypoint": []string{"/agnhost"}, "Cmd": []string{"pause"}, "Env": []string{agnhostPath}}},
		{ref: kubectlImage, files: kctl, config: map[string]any{"Entrypoint": []string{"/bin/kubectl"}, "Env": []string{"PATH=/bin"}}},
	}
	for _, s := range sidecars {
		bin := sidecarBin(s.name)
		if bin == "" {
			return fmt.Errorf("%s %s is not built", s.name, s.version)
		}
		files, err := busyboxFiles(map[string]string{"/" + s.name: bin})
		if err != nil {
			return err
		}
		images = append(images, image{ref: s.image(), files: files,
			config: map[string]any{"Entrypoint": []string{"/" + s.name}, "Env": []string{"PATH=/bin"}}})
	}
	// One layer of the test binary for all stand-ins; each image adds the
	// link, named after its sidecar, that it runs it by.
	for _, sc := range standin.Releases {
		name := filepath.Base(sc.Image)
		images = append(images, image{ref: standInImage(sc), lower: standInBase,
			files:  []ociimage.File{{Name: name, Symlink: standInBinary}},
			config: map[string]any{"Entrypoint": []string{"/" + name}, "Env": []string{"PATH=/bin"}}})
	}
	// The soak's writer (package soak) is the test binary too.
	images = append(images, image{ref: soakImage, lower: standInBase,
		files:  []ociimage.File{{Name: soak.WriterName, Symlink: standInBinary}},
		config: map[string]any{"Entrypoint": []string{"/" + soak.WriterName}, "Env": []string{"PATH=/bin"}}})
	ctr := func(args ...string) error {
		out, err := exec.Command("ctr", append([]string{"--address", containerdSock, "-n", "k8s.io", "images"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images %v: %v: %s", args, err, out)
		}
		return nil
	}
	for i, im := range images {
		archive := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		layer, err := ociimage.Layer(im.files)
		if err != nil {
			return err
		}
		layers := [][]byte{layer}
		if im.lower != nil {
			layers = [][]byte{im.lower, layer}
		}
		if err := ociimage.WriteArchive(archive, false, ociimage.Image{Ref: im.ref, Platform: dockerfile.Host(), Layers: layers, Config: im.config}); err != nil {
			return err
		}
		if err := ctr("import", archive); err != nil {
			return err
		}
		for _, tag := range upstreamTags[im.ref] {
			if err := ctr("tag", "--force", im.ref, tag); err != nil {
				return err
			}
		}
	}
	return nil
}

// busyboxFiles returns the files of a busybox image: busybox-static with a
// link per applet, the directories tests expect, and the programs of extra
// (by path in the image: path on the host), each with the shared libraries
// ldd lists for it at their paths (replacing the applet of the same name).
func busyboxFiles(extra map[string]string) ([]ociimage.File, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox-static is not installed: %w", err)
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	files := []ociimage.File{{Name: "bin", Dir: true}, {Name: "tmp", Dir: true}, {Name: "data", Dir: true},
		{Name: "bin/busybox", Mode: 0o755, Data: data}}
	have := map[string]bool{}
	for at, prog := range extra {
		paths := map[string]string{at: prog}
		out, err := exec.Command("ldd", prog).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "not a dynamic executable") {
			return nil, fmt.Errorf("ldd %s: %w: %s", prog, err, out)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				paths[f] = f
			}
		}
		for p, host := range paths {
			real, err := filepath.EvalSymlinks(host)
			if err != nil {
				return nil, err
			}
			b, err := os.ReadFile(real)
			if err != nil {
				return nil, err
			}
			for d := filepath.Dir(p); d != "/" && !have[d]; d = filepath.Dir(d) {
				have[d] = true
				files = append(files, ociimage.File{Name: strings.TrimPrefix(d, "/"), Dir: true})
			}
			if !have[p] {
				have[p] = true
				files = append(files, ociimage.File{Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Data: b})
			}
		}
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !strings.Contains(applet, "/") && !have["/bin/"+applet] {
			files = append(files, ociimage.File{Name: "bin/" + applet, Symlink: "busybox"})
		}
	}
	// Directories must precede their files in the layer.
	slices.SortStableFunc(files, func(a, b ociimage.File) int { return strings.Compare(a.Name, b.Name) })
	return files, nil
}
