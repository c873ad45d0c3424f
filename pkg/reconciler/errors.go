package reconciler

import (
	"errors"
	"fmt"
	"os"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
)

// pathError classifies a failure to resolve a request path: a missing or
// symlinked path is the caller's to fix, so it is terminal.
func pathError(what, path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return classified.Terminalf(classified.KindFailedPrecondition, "%s %s does not exist", what, path)
	case errors.Is(err, devices.ErrSymlink):
		return classified.Terminalf(classified.KindInvalidArgument, "%s %s: a path component is a symlink", what, path)
	case errors.Is(err, devices.ErrOutsideRoots):
		return classified.Terminalf(classified.KindInvalidArgument, "%s %s is outside the allowed roots", what, path)
	}
	return fmt.Errorf("%s %s: %w", what, path, err)
}

// deviceError classifies a failure of the device layer: what retrying
// cannot fix (a mount the kernel refuses as invalid, a privilege the plugin
// lacks, a device without the filesystem asked for where none may be made,
// a filesystem fsck cannot repair) is terminal, with its real kind, so that
// the request answers it at once instead of a deadline; everything else is
// retried. The cause stays wrapped.
func deviceError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, devices.ErrRefused):
		return classified.Terminalf(classified.KindInvalidArgument, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrNotPermitted), errors.Is(err, devices.ErrNotFormattable):
		return classified.Terminalf(classified.KindFailedPrecondition, "%s: %w", msg, err)
	case errors.Is(err, devices.ErrFilesystemDamaged):
		// Kept and reported under pods that use it; never formatted.
		return classified.Terminalf(classified.KindDataLoss, "%s: %w", msg, err)
	}
	return fmt.Errorf("%s: %w", msg, err)
}
