package host

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrBadPath is returned by Beneath for a path that is not an absolute,
// clean path strictly inside one of the roots.
var ErrBadPath = errors.New("path is not allowed")

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
