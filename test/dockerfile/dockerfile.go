// Package dockerfile reads converge's Dockerfile as what builds the csi-node
// image, for the tests that must follow it: the e2e harness builds the image
// from it without a Docker engine (test/e2e/csiimage.go), test/image checks
// the final stage's packages against the tools the code runs, and
// TestBuildStageBuildsEachPlatform builds the binaries for every platform
// the image is built for.
package dockerfile

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
)

// Dockerfile is what the harness reads of converge's Dockerfile to build
// the csi-node image as "docker build" would, without a Docker engine: the
// Debian suite of the final stage's base image, the packages it installs,
// how the build stage builds the binaries and where the final stage puts
// them, and the image's entry point and labels. Reading is strict: an
// instruction or a form the harness would not reproduce is an error, so
// the Dockerfile cannot grow a step the tested image lacks.
type Dockerfile struct {
	Suite    string   // the final stage's base, debian:<suite>-slim
	Packages []string // installed without recommends by the final stage
	// OnBuildPlatform says that the build stage runs on the platform of
	// the machine that builds (FROM --platform=$BUILDPLATFORM) and
	// compiles for the target there; without it the stage runs on the
	// target platform, emulated wherever that is not the builder's.
	OnBuildPlatform bool
	BuildEnv        []string          // the build stage's go build environment, its ARGs not yet replaced
	BuildArgs       []string          // its go build arguments, its ARGs not yet replaced, -o and package removed
	Binaries        []Binary          // in the order the final stage copies them
	Entrypoint      []string          // the exec form of ENTRYPOINT
	Labels          map[string]string // the final stage's ARGs not yet replaced
}

// Binary is a command the build stage builds and the final stage copies
// into the image.
type Binary struct {
	Pkg  string // ./cmd/<name>
	Path string // in the image
}

// Platform is an OS and architecture, as docker build's --platform names
// them (linux/arm64).
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// Host is the platform of this machine, the build platform of everything
// the harness builds.
func Host() Platform { return Platform{OS: runtime.GOOS, Arch: runtime.GOARCH} }

// buildStage lists the instructions of the build stage that shape the
// build environment of a Docker build (a user, a directory, the module
// download) and have nothing to reproduce in the harness, which builds in
// the repository with the Go toolchain of the machine: each must appear
// exactly so.
var buildStage = []string{
	"RUN useradd --create-home --uid 10001 builder",
	"USER builder",
	"WORKDIR /home/builder/src",
	"COPY --chown=builder go.mod go.sum ./",
	"RUN go mod download",
	"COPY --chown=builder cmd ./cmd",
	"COPY --chown=builder pkg ./pkg",
}

// platformArgs are the build arguments that docker build sets to the
// target's and the builder's platform, and GoBuild sets as it would. A
// stage sees them only where it declares them with ARG.
var platformArgs = []string{"TARGETPLATFORM", "TARGETOS", "TARGETARCH", "BUILDPLATFORM", "BUILDOS", "BUILDARCH"}

// goEnv are the variables of go's environment that choose what it builds
// for. The golang image sets none of them, so the build stage's go build
// sees only those the Dockerfile sets, and GoBuild drops this machine's.
var goEnv = []string{"GOOS", "GOARCH", "CGO_ENABLED"}

var (
	// buildFrom is the build stage's base, on the platform it names (the
	// builder's) or on the target's.
	buildFrom  = regexp.MustCompile(`^FROM (?:--platform=(\S+) )?golang:1\.26-bookworm AS build$`)
	finalFrom  = regexp.MustCompile(`^FROM debian:([a-z]+)-slim$`)
	aptInstall = regexp.MustCompile(`^RUN apt-get update && apt-get install -y --no-install-recommends ([a-z0-9. +-]+) && rm -rf /var/lib/apt/lists/\*$`)
	goBuild    = regexp.MustCompile(`^RUN ((?:[A-Z_][A-Z0-9_]*=\S+ )*)go build (.*) -o (\S+) (\./cmd/[a-z-]+)$`)
	copyBinary = regexp.MustCompile(`^COPY --from=build (\S+) (\S+)$`)
	labelPair  = regexp.MustCompile(`^([a-z0-9.]+)="([^"]*)"\s*`)
	// plainValue is a version the harness stamps, and the default of ARG
	// VERSION (the release's, which test/e2e/chart holds to the chart's):
	// a word that needs no quoting where the build stage puts it.
	plainValue  = regexp.MustCompile(`^[A-Za-z0-9._+-]+$`)
	varName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	instruction = regexp.MustCompile(`^[A-Z]+\b`)
)

// Read reads the Dockerfile at path as described at Dockerfile. It fails
// on anything the harness would not reproduce.
func Read(path string) (*Dockerfile, error) {
	lines, err := instructions(path)
	if err != nil {
		return nil, err
	}
	d := &Dockerfile{Labels: map[string]string{}}
	final := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "FROM ") && !strings.HasSuffix(l, " AS build") })
	if final < 0 {
		return nil, fmt.Errorf("%s: no final stage", path)
	}
	from := buildFrom.FindStringSubmatch(lines[0])
	if from == nil {
		return nil, fmt.Errorf("%s: the build stage does not start the Dockerfile as FROM [--platform=$BUILDPLATFORM] golang:1.26-bookworm AS build: %q", path, lines[0])
	}
	switch from[1] {
	case "":
	case "$BUILDPLATFORM", "${BUILDPLATFORM}":
		d.OnBuildPlatform = true
	default:
		return nil, fmt.Errorf("%s: the build stage runs on %s; the harness builds on the builder's platform or the target's", path, from[1])
	}
	built := map[string]string{}  // where the build stage puts each package's binary
	declared := map[string]bool{} // the ARGs of the stage read so far
	for _, l := range lines[1:final] {
		if m := goBuild.FindStringSubmatch(l); m != nil {
			env, err := shellWords(m[1])
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %v", path, l, err)
			}
			args, err := shellWords(m[2])
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %v", path, l, err)
			}
			for _, w := range append(slices.Clone(env), args...) {
				if _, err := substitute(w, func(name string) (string, bool) { return "", declared[name] }); err != nil {
					return nil, fmt.Errorf("%s: %q: %v", path, l, err)
				}
			}
			if len(built) > 0 && (!slices.Equal(env, d.BuildEnv) || !slices.Equal(args, d.BuildArgs)) {
				return nil, fmt.Errorf("%s: %q: every go build must have the same environment and arguments", path, l)
			}
			if _, ok := built[m[3]]; ok {
				return nil, fmt.Errorf("%s: two builds write %s", path, m[3])
			}
			d.BuildEnv, d.BuildArgs, built[m[3]] = env, args, m[4]
			continue
		}
		if ok, err := declare(l, declared); ok {
			if err != nil {
				return nil, fmt.Errorf("%s: %v", path, err)
			}
			continue
		}
		if !slices.Contains(buildStage, l) {
			return nil, fmt.Errorf("%s: the harness does not reproduce the build stage's %q", path, l)
		}
	}
	if !slices.Contains(slices.Collect(maps.Values(built)), "./cmd/csi-node") {
		return nil, fmt.Errorf("%s: the build stage has no go build of ./cmd/csi-node", path)
	}
	clear(declared)
	for _, l := range lines[final:] {
		if ok, err := declare(l, declared); ok {
			if err != nil {
				return nil, fmt.Errorf("%s: %v", path, err)
			}
			continue
		}
		switch {
		case finalFrom.MatchString(l):
			d.Suite = finalFrom.FindStringSubmatch(l)[1]
		case strings.HasPrefix(l, "LABEL "):
			rest := strings.TrimSpace(strings.TrimPrefix(l, "LABEL "))
			for rest != "" {
				p := labelPair.FindStringSubmatch(rest)
				if p == nil {
					return nil, fmt.Errorf("%s: label %q is not key=\"value\"", path, rest)
				}
				if _, err := substitute(p[2], func(name string) (string, bool) { return "", declared[name] }); err != nil {
					return nil, fmt.Errorf("%s: label %s: %v", path, p[1], err)
				}
				d.Labels[p[1]] = p[2]
				rest = rest[len(p[0]):]
			}
		case aptInstall.MatchString(l):
			d.Packages = strings.Fields(aptInstall.FindStringSubmatch(l)[1])
		case copyBinary.MatchString(l):
			m := copyBinary.FindStringSubmatch(l)
			pkg, ok := built[m[1]]
			if !ok {
				return nil, fmt.Errorf("%s: the final stage copies %s, which the build stage does not build", path, m[1])
			}
			delete(built, m[1])
			d.Binaries = append(d.Binaries, Binary{Pkg: pkg, Path: m[2]})
		case strings.HasPrefix(l, "ENTRYPOINT "):
			if d.Entrypoint, err = execForm(strings.TrimPrefix(l, "ENTRYPOINT ")); err != nil {
				return nil, fmt.Errorf("%s: %v", path, err)
			}
		default:
			return nil, fmt.Errorf("%s: the harness does not reproduce the final stage's %q", path, l)
		}
	}
	if len(built) > 0 {
		return nil, fmt.Errorf("%s: the build stage builds %v, which the final stage does not copy", path, slices.Sorted(maps.Values(built)))
	}
	if d.Suite == "" || len(d.Packages) == 0 || len(d.Entrypoint) == 0 {
		return nil, fmt.Errorf("%s: the final stage lacks its base, its packages or the entry point: %+v", path, *d)
	}
	return d, nil
}

// instructions returns the Dockerfile's instructions, comments dropped and
// continuation lines joined with single spaces.
func instructions(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	cur := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		more := strings.HasSuffix(line, `\`)
		line = strings.TrimSpace(strings.TrimSuffix(line, `\`))
		if cur != "" {
			cur += " "
		} else if !instruction.MatchString(line) {
			return nil, fmt.Errorf("%s: %q is not an instruction", path, line)
		}
		cur += line
		if !more {
			out = append(out, strings.Join(strings.Fields(cur), " "))
			cur = ""
		}
	}
	return out, sc.Err()
}

// shellWords splits s as a shell would words of plain and double-quoted
// text, which is all the Dockerfile's go build uses.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\\' || r == '\'' || r == '`':
			return nil, fmt.Errorf("unsupported shell character %q", r)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// execForm parses ENTRYPOINT's JSON array of plain strings.
func execForm(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return nil, fmt.Errorf("ENTRYPOINT %s is not in exec form", s)
	}
	var out []string
	for _, part := range strings.Split(strings.Trim(s, "[]"), ",") {
		part = strings.TrimSpace(part)
		if len(part) < 2 || part[0] != '"' || part[len(part)-1] != '"' || strings.ContainsAny(part[1:len(part)-1], `"\`) {
			return nil, fmt.Errorf("ENTRYPOINT element %s is not a plain string", part)
		}
		out = append(out, part[1:len(part)-1])
	}
	return out, nil
}

// declare adds to declared the names that l declares, if it is an ARG:
// the release version with its plain default (a build passes its own), or
// platform arguments, which docker build sets (GoBuild sets them as it
// would). It reports whether l is an ARG, and an error for any other.
func declare(l string, declared map[string]bool) (bool, error) {
	rest, ok := strings.CutPrefix(l, "ARG ")
	if !ok {
		return false, nil
	}
	for _, f := range strings.Fields(rest) {
		name, value, defaulted := strings.Cut(f, "=")
		switch {
		case name == "VERSION" && defaulted && plainValue.MatchString(value):
		case slices.Contains(platformArgs, name) && !defaulted:
		default:
			return true, fmt.Errorf("ARG %s: the harness sets VERSION, declared with a plain default, and the platform arguments %v, declared without", f, platformArgs)
		}
		declared[name] = true
	}
	return true, nil
}

// substitute replaces each $NAME and ${NAME} in s with value(NAME), as the
// shell expands in a RUN the build arguments that Docker puts into its
// environment, and as Docker expands them in a LABEL. A name that value
// does not know (for the Dockerfile: not an ARG of the stage, which Docker
// would leave empty), and any other form ($1, ${NAME:-default}, a $
// alone), is an error.
func substitute(s string, value func(name string) (string, bool)) (string, error) {
	var out strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			out.WriteString(s)
			return out.String(), nil
		}
		out.WriteString(s[:i])
		s = s[i+1:]
		var name string
		if braced, ok := strings.CutPrefix(s, "{"); ok {
			end := strings.IndexByte(braced, '}')
			if end < 0 {
				return "", fmt.Errorf("an unterminated ${")
			}
			name, s = braced[:end], braced[end+1:]
		} else {
			n := strings.IndexFunc(s, func(r rune) bool {
				return !(r == '_' || r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z')
			})
			if n < 0 {
				n = len(s)
			}
			name, s = s[:n], s[n:]
		}
		if !varName.MatchString(name) {
			return "", fmt.Errorf("$%s: the harness expands only $NAME and ${NAME}", name)
		}
		v, ok := value(name)
		if !ok {
			return "", fmt.Errorf("$%s is not an ARG of its stage", name)
		}
		out.WriteString(v)
	}
}

// args are the values of the build arguments a stage may declare when
// docker build --platform target --build-arg VERSION=version runs on this
// machine.
func args(target Platform, version string) (func(string) (string, bool), error) {
	if !plainValue.MatchString(version) || !plainValue.MatchString(target.OS) || !plainValue.MatchString(target.Arch) {
		return nil, fmt.Errorf("version %q and platform %s must be plain words", version, target)
	}
	build := Host()
	values := map[string]string{
		"VERSION":        version,
		"TARGETPLATFORM": target.String(), "TARGETOS": target.OS, "TARGETARCH": target.Arch,
		"BUILDPLATFORM": build.String(), "BUILDOS": build.OS, "BUILDARCH": build.Arch,
	}
	return func(name string) (string, bool) { v, ok := values[name]; return v, ok }, nil
}

// GoBuild returns the go build that the build stage runs for b when
// docker build --platform target --build-arg VERSION=version builds the
// image on this machine, writing the binary to out; it runs in repo, the
// repository's root (the stage's copy of cmd and pkg). Its environment is
// this machine's without the variables that choose go's target (goEnv),
// plus the stage's own. A build stage that runs on the target platform is
// reproduced only for this machine's platform: for any other, Docker would
// run it, and its go, under emulation.
func (d *Dockerfile) GoBuild(ctx context.Context, repo string, target Platform, version string, b Binary, out string) (*exec.Cmd, error) {
	if !d.OnBuildPlatform && target != Host() {
		return nil, fmt.Errorf("the build stage runs on the target platform, %s, which this machine (%s) would only emulate: it must cross-compile, on FROM --platform=$BUILDPLATFORM", target, Host())
	}
	if !slices.Contains(d.Binaries, b) {
		return nil, fmt.Errorf("the image holds no %+v", b)
	}
	value, err := args(target, version)
	if err != nil {
		return nil, err
	}
	var env, build []string
	for _, w := range d.BuildEnv {
		v, err := substitute(w, value)
		if err != nil {
			return nil, err
		}
		env = append(env, v)
	}
	for _, w := range d.BuildArgs {
		v, err := substitute(w, value)
		if err != nil {
			return nil, err
		}
		build = append(build, v)
	}
	cmd := exec.CommandContext(ctx, "go", slices.Concat([]string{"build"}, build, []string{"-o", out, b.Pkg})...)
	cmd.Dir = repo
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(goEnv, name)
	})
	cmd.Env = append(cmd.Env, env...)
	return cmd, nil
}

// ImageLabels returns the image's labels as docker build --platform target
// --build-arg VERSION=version sets them.
func (d *Dockerfile) ImageLabels(target Platform, version string) (map[string]string, error) {
	value, err := args(target, version)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	for k, v := range d.Labels {
		if labels[k], err = substitute(v, value); err != nil {
			return nil, err
		}
	}
	return labels, nil
}
