package privilege

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDocumented checks that SECURITY.md's table of privileges is Table,
// row for row: what the e2e suite asks the API server is what the
// document promises.
func TestDocumented(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "..", "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Table, doc); diff != "" {
		t.Errorf("SECURITY.md's table differs from Table (-Table +SECURITY.md):\n%s\nTable reads:\n%s", diff, Markdown(Table))
	}
}

// TestParts checks how a Resource splits into what a SubjectAccessReview
// asks for.
func TestParts(t *testing.T) {
	for _, tc := range []struct{ resource, group, res, sub string }{
		{"secrets", "", "secrets", ""},
		{"leases.coordination.k8s.io", "coordination.k8s.io", "leases", ""},
		{"persistentvolumeclaims/status", "", "persistentvolumeclaims", "status"},
		{"volumesnapshotcontents/status.snapshot.storage.k8s.io", "snapshot.storage.k8s.io", "volumesnapshotcontents", "status"},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			g, r, s := Question{Resource: tc.resource}.Parts()
			if g != tc.group || r != tc.res || s != tc.sub {
				t.Errorf("got %q %q %q, want %q %q %q", g, r, s, tc.group, tc.res, tc.sub)
			}
		})
	}
}

// TestParseRoundTrip checks that Parse reads back what Markdown writes,
// and refuses a row it cannot read.
func TestParseRoundTrip(t *testing.T) {
	got, err := Parse(strings.NewReader("# x\n\n" + Markdown(Table) + "\nafter\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Table, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, err := Parse(strings.NewReader(Header + "\n|---|\n| a | b | c |\n")); err == nil {
		t.Error("a row of 3 cells: got no error")
	}
	if _, err := Parse(strings.NewReader("no table\n")); err == nil {
		t.Error("no table: got no error")
	}
}
