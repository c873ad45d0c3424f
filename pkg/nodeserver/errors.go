package nodeserver

import (
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// invalid is the answer to a request that is not valid.
func invalid(format string, args ...any) error {
	return classified.Errorf(classified.KindInvalidArgument, format, args...)
}

// notFound is the answer for a volume this node does not know.
func notFound(id string) error { return state.NotFound(id) }
