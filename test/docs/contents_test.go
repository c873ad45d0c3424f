package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestContentsListEveryHeading checks each document with a "## Contents"
// list: the list links every heading of levels 2 and 3 (but its own), in
// order, at its depth, so that it stays the document's table of contents.
func TestContentsListEveryHeading(t *testing.T) {
	docs, _ := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	found := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		contents, headings, ok := contentsOf(string(b))
		if !ok {
			continue
		}
		found++
		if strings.Join(contents, "\n") != strings.Join(headings, "\n") {
			t.Errorf("%s's Contents:\n%s\nwant, from its headings:\n%s", doc, strings.Join(contents, "\n"), strings.Join(headings, "\n"))
		}
	}
	if found == 0 {
		t.Error("no document has a Contents list; docs/operations.md should")
	}
}

// contentsOf returns the lines of text's "## Contents" list, and the list
// its headings of levels 2 and 3 (outside code blocks) make; false when it
// has no such list.
func contentsOf(text string) (contents, headings []string, ok bool) {
	fenced, in := false, false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		switch {
		case fenced:
		case line == "## Contents":
			ok, in = true, true
		case in && strings.HasPrefix(strings.TrimSpace(line), "- ["):
			contents = append(contents, line)
		case strings.HasPrefix(line, "## "), strings.HasPrefix(line, "### "):
			in = false
			title := strings.TrimLeft(line, "# ")
			indent := ""
			if strings.HasPrefix(line, "### ") {
				indent = "  "
			}
			headings = append(headings, fmt.Sprintf("%s- [%s](#%s)", indent, title, slug(title)))
		}
	}
	return contents, headings, ok
}
