package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var (
	// docTestName is a test, benchmark or fuzz target a document names.
	// Followed by "...", it names every test it begins.
	docTestName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*(?:\.\.\.)?`)
	// testFunc is one declared in Go; testEntry one that a table of
	// subtests names by a string, as TestConcurrent runs its parts.
	testFunc  = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)\(`)
	testEntry = regexp.MustCompile(`"((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)"`)
)

// TestNamedTestsExist reads every document that tells how things are now
// (docs/, the READMEs, SECURITY.md; the CHANGELOG is history) and fails
// for each test, benchmark or fuzz target it names that no Go file of the
// repository declares or runs by that name: a renamed or removed test
// leaves no claim behind it.
func TestNamedTestsExist(t *testing.T) {
	root := "../.."
	known := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".run" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, re := range []*regexp.Regexp{testFunc, testEntry} {
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				known[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !known["TestNamedTestsExist"] {
		t.Fatalf("found %d tests, and not this one: the walk missed the repository", len(known))
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"), filepath.Join(root, "SECURITY.md"),
		filepath.Join(root, "test", "README.md"), filepath.Join(root, "docs", "examples", "README.md"))
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		missing := map[string]bool{}
		for _, name := range docTestName.FindAllString(string(b), -1) {
			if prefix, ok := strings.CutSuffix(name, "..."); ok {
				if !anyPrefixed(known, prefix) {
					missing[name] = true
				}
			} else if !known[name] {
				missing[name] = true
			}
		}
		var names []string
		for n := range missing {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Errorf("%s names %s, which no test file declares", strings.TrimPrefix(doc, root+"/"), n)
		}
	}
}

// anyPrefixed says whether a name of known begins with prefix.
func anyPrefixed(known map[string]bool, prefix string) bool {
	for n := range known {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
