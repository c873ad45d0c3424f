package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// TestDocumentedPolicyCheck runs docs/operations.md's check that the
// node-volumes policy is enforced, as written, with the cluster's admin
// kubeconfig: it must answer the policy's refusal. The admin kubeconfig
// carries a client certificate, as kind's, kubeadm's, k3s' and minikube's
// do, on which a check that sends a pod's token (kubectl --token) runs as
// the admin and is accepted: a false "not enforced".
func TestDocumentedPolicyCheck(t *testing.T) {
	script := docsCommand(t, filepath.Join(c.repo, "docs", "operations.md"), "converge-policy-check")
	cfg, err := clientcmd.LoadFromFile(c.admin)
	if err != nil {
		t.Fatal(err)
	}
	for name, u := range cfg.AuthInfos {
		t.Logf("the admin kubeconfig's user %s: client certificate %t, token %t",
			name, u.ClientCertificate != "" || len(u.ClientCertificateData) > 0, u.Token != "" || u.TokenFile != "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-eu", "-o", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.admin, "PATH="+c.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	t.Logf("the documented check answers (%v):\n%s", err, out)
	if err == nil {
		t.Fatalf("the documented check was accepted, want the policy %s's refusal", nodeVolumesPolicy)
	}
	if want := "ValidatingAdmissionPolicy '" + nodeVolumesPolicy + "'"; !strings.Contains(string(out), want) ||
		!strings.Contains(string(out), "denied request") {
		t.Fatalf("the documented check answers %q, want %s ... denied request", out, want)
	}
}

// docsCommand returns the one ```sh block of the Markdown file path that
// contains marker, its lines taken out of the list item that indents them.
func docsCommand(t *testing.T, path, marker string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	var block []string
	indent, in := "", false
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case !in && trimmed == "```sh":
			in, indent, block = true, line[:len(line)-len(trimmed)], nil
		case in && trimmed == "```":
			in = false
			if text := strings.Join(block, "\n") + "\n"; strings.Contains(text, marker) {
				found = append(found, text)
			}
		case in:
			block = append(block, strings.TrimPrefix(line, indent))
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s has %d sh blocks with %q, want one", path, len(found), marker)
	}
	return found[0]
}
