// Package dockerfile reads converge's Dockerfile as what builds the csi-node
// image, for the tests that must follow it: the e2e harness builds the image
// from it without a Docker engine (test/e2e/csiimage.go), and test/image
// checks the final stage's packages against the tools the code runs.
package dockerfile

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"regexp"
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
	Suite      string            // the final stage's base, debian:<suite>-slim
	Packages   []string          // installed without recommends by the final stage
	BuildEnv   []string          // the build stage's go build environment (CGO_ENABLED=0)
	BuildArgs  []string          // its go build arguments, ${VERSION} not yet replaced, -o and package removed
	Binaries   []Binary          // in the order the final stage copies them
	Entrypoint []string          // the exec form of ENTRYPOINT
	Labels     map[string]string // ${VERSION} not yet replaced
}

// Binary is a command the build stage builds and the final stage copies
// into the image.
type Binary struct {
	Pkg  string // ./cmd/<name>
	Path string // in the image
}

// buildStage lists the instructions of the build stage that shape the
// build environment of a Docker build (a user, a directory, the module
// download) and have nothing to reproduce in the harness, which builds in
// the repository with the Go toolchain of the machine: each must appear
// exactly so.
var buildStage = []string{
	"FROM golang:1.26-bookworm AS build",
	"RUN useradd --create-home --uid 10001 builder",
	"USER builder",
	"WORKDIR /home/builder/src",
	"COPY --chown=builder go.mod go.sum ./",
	"RUN go mod download",
	"COPY --chown=builder cmd ./cmd",
	"COPY --chown=builder pkg ./pkg",
}

var (
	finalFrom  = regexp.MustCompile(`^FROM debian:([a-z]+)-slim$`)
	aptInstall = regexp.MustCompile(`^RUN apt-get update && apt-get install -y --no-install-recommends ([a-z0-9. +-]+) && rm -rf /var/lib/apt/lists/\*$`)
	goBuild    = regexp.MustCompile(`^RUN ((?:[A-Z_]+=\S+ )*)go build (.*) -o (\S+) (\./cmd/[a-z-]+)$`)
	copyBinary = regexp.MustCompile(`^COPY --from=build (\S+) (\S+)$`)
	labelPair  = regexp.MustCompile(`^([a-z0-9.]+)="([^"]*)"\s*`)
	// versionArg declares the version a build stamps, with its default
	// (the release's, which test/e2e/chart holds to the chart's).
	versionArg  = regexp.MustCompile(`^ARG VERSION=\S+$`)
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
	built := map[string]string{} // where the build stage puts each package's binary
	for _, l := range lines[:final] {
		if m := goBuild.FindStringSubmatch(l); m != nil {
			env := strings.Fields(m[1])
			args, err := shellWords(m[2])
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %v", path, l, err)
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
		if !slices.Contains(buildStage, l) && !versionArg.MatchString(l) {
			return nil, fmt.Errorf("%s: the harness does not reproduce the build stage's %q", path, l)
		}
	}
	if !slices.Contains(slices.Collect(maps.Values(built)), "./cmd/csi-node") {
		return nil, fmt.Errorf("%s: the build stage has no go build of ./cmd/csi-node", path)
	}
	for _, l := range lines[final:] {
		switch {
		case finalFrom.MatchString(l):
			d.Suite = finalFrom.FindStringSubmatch(l)[1]
		case versionArg.MatchString(l):
		case strings.HasPrefix(l, "LABEL "):
			rest := strings.TrimSpace(strings.TrimPrefix(l, "LABEL "))
			for rest != "" {
				p := labelPair.FindStringSubmatch(rest)
				if p == nil {
					return nil, fmt.Errorf("%s: label %q is not key=\"value\"", path, rest)
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

// Expand replaces ${VERSION} with version.
func Expand(s, version string) string { return strings.ReplaceAll(s, "${VERSION}", version) }
