package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsSayTheRunsArguments checks that deploy/README.md and
// docs/operations.md, which tell a reader how the run installs deploy/,
// name each argument the run adds to csi-node's, as given, and count them
// right.
func TestDocsSayTheRunsArguments(t *testing.T) {
	words := []string{"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
	if len(installArgs) >= len(words) {
		t.Fatalf("%d arguments: give the test a word for the number", len(installArgs))
	}
	count := regexp.MustCompile(`(\w+) (?:of csi-node's arguments|arguments to csi-node's)`)
	for _, doc := range []string{"deploy/README.md", "docs/operations.md"} {
		b, err := os.ReadFile(filepath.Join(c.repo, doc))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ")
		for _, arg := range installArgs {
			if !strings.Contains(text, "`"+arg+"`") {
				t.Errorf("%s does not name the run's csi-node argument `%s`", doc, arg)
			}
		}
		m := count.FindAllStringSubmatch(text, -1)
		if len(m) != 1 || m[0][1] != words[len(installArgs)] {
			t.Errorf("%s counts the run's csi-node arguments as %q, want one count, %q", doc, m, words[len(installArgs)])
		}
	}
}
