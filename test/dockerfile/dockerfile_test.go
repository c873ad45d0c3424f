package dockerfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDockerfileIsReadStrictly reads converge's Dockerfile as the harness
// builds from it, then checks that each change the harness would not
// reproduce makes reading it fail.
func TestDockerfileIsReadStrictly(t *testing.T) {
	path := filepath.Join("..", "..", "Dockerfile")
	d, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []Binary{{"./cmd/csi-node", "/usr/local/bin/csi-node"}, {"./cmd/converge-controller", "/usr/local/bin/converge-controller"}}
	if d.Suite != "bookworm" || !slices.Contains(d.Packages, "xfsprogs") || !slices.Equal(d.Binaries, want) ||
		!slices.Equal(d.Entrypoint, []string{"/usr/local/bin/csi-node"}) ||
		!d.OnBuildPlatform || !slices.Equal(d.BuildEnv, []string{"GOOS=${TARGETOS}", "GOARCH=${TARGETARCH}", "CGO_ENABLED=0"}) {
		t.Errorf("read %+v", *d)
	}
	if labels, err := d.ImageLabels(Host(), "v9"); err != nil || labels["org.opencontainers.image.version"] != "v9" {
		t.Errorf("labels %v, %v: want the version v9", labels, err)
	}
	if got := strings.Join(d.BuildArgs, " "); got != "-trimpath -tags grpcnotrace -ldflags -s -w -X main.version=${VERSION}" {
		t.Errorf("go build arguments: got %q", got)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(string) string{
		"an ENV":                  func(s string) string { return s + "ENV A=b\n" },
		"a USER in the final one": func(s string) string { return s + "USER nobody\n" },
		"another RUN":             func(s string) string { return s + "RUN rm -rf /usr/share\n" },
		"a CMD":                   func(s string) string { return s + `CMD ["--help"]` + "\n" },
		"another base":            func(s string) string { return strings.Replace(s, "FROM debian:bookworm-slim", "FROM alpine:3", 1) },
		"recommends":              func(s string) string { return strings.Replace(s, " --no-install-recommends", "", 1) },
		"a shell ENTRYPOINT": func(s string) string {
			return strings.Replace(s, `ENTRYPOINT ["/usr/local/bin/csi-node"]`, "ENTRYPOINT /usr/local/bin/csi-node", 1)
		},
		"a copied binary moved": func(s string) string {
			return strings.Replace(s, "COPY --from=build /home/builder/csi-node", "COPY --from=build /tmp/csi-node", 1)
		},
		"a build flag in a RUN": func(s string) string { return strings.Replace(s, "RUN go mod download", "RUN go mod download -x", 1) },
		"a binary built and not copied": func(s string) string {
			return strings.Replace(s, "COPY --from=build /home/builder/converge-controller /usr/local/bin/converge-controller\n", "", 1)
		},
		"two binaries built differently": func(s string) string {
			return strings.Replace(s, `-X main.version=${VERSION}" -o /home/builder/converge-controller`, `" -o /home/builder/converge-controller`, 1)
		},
		"an ARG the harness does not set": func(s string) string { return strings.Replace(s, "ARG VERSION=", "ARG GOFLAGS\nARG VERSION=", 1) },
		"a default for a platform argument": func(s string) string {
			return strings.Replace(s, "ARG VERSION=", "ARG TARGETARCH=amd64\nARG VERSION=", 1)
		},
		"a variable no ARG declares": func(s string) string {
			return strings.ReplaceAll(s, "CGO_ENABLED=0 go build", "GOAMD64=${GOAMD64} CGO_ENABLED=0 go build")
		},
		"a shell default": func(s string) string {
			return strings.ReplaceAll(s, "main.version=${VERSION}", "main.version=${VERSION:-devel}")
		},
		"a label of a variable its stage does not declare": func(s string) string {
			return strings.Replace(s, `version="${VERSION}"`, `version="${TARGETARCH}"`, 1)
		},
		"the build stage on a fixed platform": func(s string) string {
			return strings.Replace(s, "FROM --platform=$BUILDPLATFORM golang", "FROM --platform=linux/amd64 golang", 1)
		},
		"the target's platform not declared": func(s string) string { return strings.Replace(s, "ARG TARGETOS TARGETARCH\n", "", 1) },
	} {
		changed := edit(string(orig))
		if changed == string(orig) {
			t.Errorf("%s: the edit changed nothing", name)
			continue
		}
		p := filepath.Join(t.TempDir(), "Dockerfile")
		if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(p); err == nil {
			t.Errorf("%s: read without error, want the harness to refuse it", name)
		}
	}
}
