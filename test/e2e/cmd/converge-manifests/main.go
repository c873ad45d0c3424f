// converge-manifests writes deploy/'s object files, generated from the
// Helm chart (package manifests): make manifests runs it. It fails,
// writing nothing, if a kustomization.yaml of deploy/ holds more than the
// glue or does not list exactly the files generated beside it, or if
// kustomize, with deploy/'s kustomizations over the generated files,
// builds in some combination of the components other objects than the
// chart renders with them on.
//
//	converge-manifests -repo <root>
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/converge-csi/converge/test/e2e/manifests"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: converge-manifests -repo <root>")
		os.Exit(2)
	}
	deploy := filepath.Join(*repo, "deploy")
	files, err := manifests.Generate(filepath.Join(*repo, "charts", "converge"), deploy)
	if err == nil {
		err = manifests.Write(deploy, files)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "converge-manifests:", err)
		os.Exit(1)
	}
	fmt.Printf("converge-manifests: %d files in %s\n", len(files), deploy)
}
