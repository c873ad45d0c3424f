// Package docs checks the project's documents: every relative link leads
// to a file that exists, and every #anchor to a heading of that file.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// slug is GitHub's anchor of a heading: lower case, punctuation dropped
// but for hyphens and underscores, spaces made hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestLinks(t *testing.T) {
	root := "../.."
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"), filepath.Join(root, "SECURITY.md"),
		filepath.Join(root, "test", "README.md"), filepath.Join(root, "docs", "examples", "README.md"), filepath.Join(root, "charts", "converge", "README.md"))
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		a := map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
			a[slug(m[1])] = true
		}
		anchors[path] = a
		return a
	}
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", doc, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", doc, target, path, anchor)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Errorf("only %d links checked: the parsing is off", checked)
	}
}
