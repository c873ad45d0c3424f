package state

import (
	"errors"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
)

// TestNotFoundWrapsErrNotFound checks the classified answer for a volume
// without a record: NOT_FOUND, naming the volume, and still ErrNotFound
// to errors.Is, which the node server tests for.
func TestNotFoundWrapsErrNotFound(t *testing.T) {
	e := NotFound("v1")
	if e.Kind != classified.KindNotFound || e.Terminal || e.Message != "volume v1 not found" || !errors.Is(e, ErrNotFound) {
		t.Errorf("NotFound(v1): got %+v, want a non-terminal NotFound \"volume v1 not found\" wrapping ErrNotFound", e)
	}
}
