// converge-release makes the files of a release of the repository
// (package dist) into a directory: make release runs it, and the release
// workflow publishes what it makes.
//
//	converge-release -repo <root> -out <dir> [-platforms linux/amd64,linux/arm64]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/converge-csi/converge/test/dockerfile"
	"github.com/converge-csi/converge/test/e2e/dist"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root")
	out := flag.String("out", "", "the release's directory (made; must not exist or be empty)")
	platforms := flag.String("platforms", dockerfile.Host().String(), "comma-separated platforms of the image, os/arch")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: converge-release -repo <root> -out <dir> [-platforms linux/amd64,linux/arm64]")
		os.Exit(2)
	}
	var ps []dockerfile.Platform
	for _, s := range strings.Split(*platforms, ",") {
		os_, arch, ok := strings.Cut(strings.TrimSpace(s), "/")
		if !ok || os_ == "" || arch == "" || strings.Contains(arch, "/") {
			fmt.Fprintf(os.Stderr, "converge-release: platform %q is not os/arch\n", s)
			os.Exit(2)
		}
		ps = append(ps, dockerfile.Platform{OS: os_, Arch: arch})
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "converge-release:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := dist.Build(ctx, dist.Options{Repo: *repo, Out: *out, CacheDir: filepath.Join(cache, "converge-e2e"), Platforms: ps})
	if err != nil {
		fmt.Fprintln(os.Stderr, "converge-release:", err)
		os.Exit(1)
	}
	fmt.Printf("converge %s: image %s, in %s:\n", r.Version, r.ImageRef, *out)
	for _, f := range r.Files {
		fmt.Println("  " + f)
	}
}
