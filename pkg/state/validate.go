package state

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// MaxIDLength is the longest volume ID or name; CSI's limit for strings
// that serve as identifiers.
const MaxIDLength = 128

// ErrBadPath is returned by Beneath for a path that is not an absolute,
// clean path strictly inside one of the roots.
var ErrBadPath = errors.New("path is not allowed")

// ValidID checks that id may name a volume: 1 to MaxIDLength bytes of
// [A-Za-z0-9._-], not starting with a dot (so never "." or ".." and never a
// hidden file in the data directory).
func ValidID(id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("volume ID must be 1 to %d bytes long, got %d", MaxIDLength, len(id))
	}
	if id[0] == '.' {
		return fmt.Errorf("volume ID %q must not start with a dot", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("volume ID %q may only hold letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// MaxPathLen is Linux's PATH_MAX: no longer path can be resolved, so none
// is accepted.
const MaxPathLen = 4096

// Beneath checks that path is absolute, clean, shorter than MaxPathLen and
// strictly inside one of roots, and returns the longest such root and the
// path relative to it.
func Beneath(path string, roots []string) (root, rel string, err error) {
	if !filepath.IsAbs(path) {
		return "", "", fmt.Errorf("%w: %q is not absolute", ErrBadPath, path)
	}
	if filepath.Clean(path) != path {
		return "", "", fmt.Errorf("%w: %q is not clean", ErrBadPath, path)
	}
	if strings.ContainsRune(path, 0) {
		return "", "", fmt.Errorf("%w: %q holds a NUL byte", ErrBadPath, path)
	}
	if len(path) >= MaxPathLen {
		return "", "", fmt.Errorf("%w: path of %d bytes, at most %d", ErrBadPath, len(path), MaxPathLen-1)
	}
	for _, r := range roots {
		r = filepath.Clean(r)
		var ok bool
		var candidate string
		if r == "/" {
			candidate, ok = path[1:], path != "/"
		} else {
			candidate, ok = strings.CutPrefix(path, r+"/")
		}
		if ok && candidate != "" && len(r) >= len(root) {
			root, rel = r, candidate
		}
	}
	if root == "" {
		return "", "", fmt.Errorf("%w: %s is outside the allowed roots %v", ErrBadPath, path, roots)
	}
	return root, rel, nil
}
