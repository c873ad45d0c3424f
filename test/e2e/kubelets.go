package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// olderKubelets are the kubelet releases the suite runs beside its
// cluster's own, oldest first: Kubernetes supports kubelets up to three
// minors older than the API server, and a cluster upgrades its nodes one
// by one, so converge's DaemonSet meets several kubelets at once. The
// chart's kubeVersion (>=1.34, what the sidecars of deploy/ need:
// TestKubeVersionFitsTheSidecars) allows v1.34 too, which is untested. A release here is built
// from the module test/e2e/kubelets/v<major>.<minor>, which requires it;
// one that is not older than kubernetesVersion is skipped (the cluster's
// own kubelet is tested by everything else).
var olderKubelets = []string{"v1.35.4", "v1.36.3"}

// minorOf is version's major and minor ("v1.35" of "v1.35.4"), and the
// minor alone as a number.
func minorOf(version string) (string, int) {
	major, rest, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ := strings.Cut(rest, ".")
	n, err := strconv.Atoi(minor)
	if err != nil || major != "1" {
		panic(fmt.Sprintf("a Kubernetes version of the suite is not v1.<minor>.<patch>: %q", version))
	}
	return "v" + major + "." + minor, n
}

// olderKubeletsToRun are the olderKubelets of a minor below the cluster's,
// oldest first.
func olderKubeletsToRun() []string {
	_, cluster := minorOf(kubernetesVersion)
	var older []string
	for _, v := range olderKubelets {
		if _, m := minorOf(v); m < cluster {
			older = append(older, v)
		}
	}
	return older
}

// versionLDFlags are the linker flags that stamp version into a Kubernetes
// binary, as a release build does (hack/lib/version.sh): the kubelet
// reports it in its Node's nodeInfo.kubeletVersion, the API server in
// /version.
func versionLDFlags(version string) string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	var flags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags, "-X "+pkg+".gitVersion="+version, "-X "+pkg+".gitMajor="+major,
			"-X "+pkg+".gitMinor="+minor, "-X "+pkg+".gitTreeState=clean")
	}
	return strings.Join(flags, " ")
}

// buildOlderKubelets builds the kubelet of each of olderKubeletsToRun into
// the user's cache directory, keyed by version, or finds the one built
// there before with the same flags (buildTools); each is built alone, not
// the rest of its release. make test's kubelets step runs it
// (-build-kubelets) beside the first tests, which need none of them.
func (c *cluster) buildOlderKubelets(ctx context.Context) error {
	for _, v := range olderKubeletsToRun() {
		if _, err := c.olderKubelet(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// olderKubelet is the kubelet of version, one of olderKubeletsToRun, found
// or built (waiting for the kubelets step when it builds it now).
func (c *cluster) olderKubelet(ctx context.Context, version string) (string, error) {
	c.olderKubeletsMu.Lock()
	defer c.olderKubeletsMu.Unlock()
	if bin, ok := c.olderKubelets[version]; ok {
		return bin, nil
	}
	minor, _ := minorOf(version)
	bin, err := c.buildTools(ctx, "kubelet-"+version, filepath.Join("kubelets", minor), "kubelet", "-s -w "+versionLDFlags(version))
	if err != nil {
		return "", fmt.Errorf("kubelet %s: %w", version, err)
	}
	if c.olderKubelets == nil {
		c.olderKubelets = map[string]string{}
	}
	c.olderKubelets[version] = filepath.Join(bin, "kubelet")
	return c.olderKubelets[version], nil
}

// kubeletBinary is the kubelet of version: the cluster's own, or one of
// olderKubeletsToRun, found or built (within 30 minutes).
func (c *cluster) kubeletBinary(version string) (string, error) {
	if version == kubernetesVersion {
		return filepath.Join(c.bin, "kubelet"), nil
	}
	if !slices.Contains(olderKubeletsToRun(), version) {
		return "", fmt.Errorf("no kubelet %s: the cluster runs %s and builds %v", version, kubernetesVersion, olderKubeletsToRun())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	return c.olderKubelet(ctx, version)
}

// oldestKubelet is the oldest kubelet of olderKubeletsToRun, or the
// cluster's own when there is none.
func oldestKubelet() string {
	if older := olderKubeletsToRun(); len(older) > 0 {
		return older[0]
	}
	return kubernetesVersion
}
