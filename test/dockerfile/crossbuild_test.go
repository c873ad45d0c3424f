package dockerfile

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// machines are the ELF machines of the architectures the image is built
// for.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestBuildStageBuildsEachPlatform builds every binary of the image as the
// Dockerfile's build stage does when the multi-arch build of its header
// (docker buildx build --platform linux/amd64,linux/arm64) runs on this
// machine, and checks that each is a static executable of its platform's
// machine: the final stage of each platform is that platform's Debian, with
// no loader for another architecture and no C library the binary could
// link against. Cold, the Go build cache takes minutes to compile
// client-go for arm64 (converge-controller); warm, seconds.
func TestBuildStageBuildsEachPlatform(t *testing.T) {
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(repo, "Dockerfile")
	d, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	platforms := documentedPlatforms(t, path)
	for _, want := range []Platform{{"linux", "amd64"}, {"linux", "arm64"}} {
		if !slices.Contains(platforms, want) {
			t.Errorf("the Dockerfile's multi-arch build names %v, not %s", platforms, want)
		}
	}
	for _, p := range platforms {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			// A cold cross-build compiles every dependency again for the
			// other architecture (about 9 minutes on CI's 2 cores): make
			// crossbuild runs it, not make test (docs/testing.md).
			if p.Arch != runtime.GOARCH && os.Getenv("CONVERGE_CROSSBUILD") == "" {
				t.Skipf("the build for %s: make crossbuild runs it (CONVERGE_CROSSBUILD=1)", p)
			}
			machine, ok := machines[p.Arch]
			if !ok || p.OS != "linux" {
				t.Fatalf("no ELF machine known for %s", p)
			}
			for _, b := range d.Binaries {
				out := filepath.Join(t.TempDir(), filepath.Base(b.Pkg))
				cmd, err := d.GoBuild(t.Context(), repo, p, "v0.0.0-crossbuild", b, out)
				if err != nil {
					t.Fatal(err)
				}
				if msg, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, msg)
				}
				if err := checkStatic(out, machine); err != nil {
					t.Errorf("%s for %s: %v", b.Pkg, p, err)
				}
			}
		})
	}
}

// documentedPlatforms returns the platforms of the multi-arch build that the
// Dockerfile's header comment documents.
func documentedPlatforms(t *testing.T, path string) []Platform {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#\s+docker buildx build --platform (\S+) `).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s documents no docker buildx build --platform", path)
	}
	var out []Platform
	for _, p := range strings.Split(string(m[1]), ",") {
		goos, arch, ok := strings.Cut(p, "/")
		if !ok {
			t.Fatalf("%s: platform %q is not os/arch", path, p)
		}
		out = append(out, Platform{OS: goos, Arch: arch})
	}
	return out
}

// checkStatic returns an error unless the ELF executable at path is for
// machine and static: no program interpreter (the dynamic loader) and no
// shared library it needs.
func checkStatic(path string, machine elf.Machine) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var problems []string
	if f.Machine != machine {
		problems = append(problems, "machine "+f.Machine.String()+", want "+machine.String())
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			problems = append(problems, "a program interpreter (dynamically linked)")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return err
	}
	if len(libs) > 0 {
		problems = append(problems, "needs shared libraries "+strings.Join(libs, ", "))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// TestDocsBuildEveryPlatform checks the multi-arch build that the install
// documents give (deploy/README.md refers to operations.md's) against the
// Dockerfile's own: the same platforms (those that
// TestBuildStageBuildsEachPlatform builds), the version stamped as the
// image is tagged, and the image pushed (a multi-platform image cannot be
// loaded into a classic Docker image store).
func TestDocsBuildEveryPlatform(t *testing.T) {
	want := documentedPlatforms(t, filepath.Join("..", "..", "Dockerfile"))
	command := regexp.MustCompile(`(?m)^\s*#?\s*(docker buildx build .*)$`)
	for _, doc := range []string{"Dockerfile", "README.md", "docs/operations.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		found := command.FindAllSubmatch(b, -1)
		if len(found) == 0 {
			t.Errorf("%s: no docker buildx build", doc)
		}
		for _, m := range found {
			args := strings.Fields(string(m[1]))
			flag := func(name string) string {
				if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
					return args[i+1]
				}
				return ""
			}
			var platforms []Platform
			for _, p := range strings.Split(flag("--platform"), ",") {
				goos, arch, _ := strings.Cut(p, "/")
				platforms = append(platforms, Platform{OS: goos, Arch: arch})
			}
			_, tag, _ := strings.Cut(flag("-t"), ":")
			switch {
			case !slices.Equal(platforms, want):
				t.Errorf("%s: %s: platforms %v, want the Dockerfile's %v", doc, m[1], platforms, want)
			case tag == "" || flag("--build-arg") != "VERSION="+tag:
				t.Errorf("%s: %s: want --build-arg VERSION= the tag", doc, m[1])
			case !slices.Contains(args, "--push") || args[len(args)-1] != ".":
				t.Errorf("%s: %s: want --push of the repository's root", doc, m[1])
			}
		}
	}
}
