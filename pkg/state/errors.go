package state

import (
	"errors"
	"fmt"

	"github.com/converge-csi/converge/pkg/classified"
)

// ErrNotFound is returned when a volume has no record.
var ErrNotFound = errors.New("volume not found")

// NotFound is the classified error of a volume id that does not exist; it
// wraps ErrNotFound.
func NotFound(id string) *classified.Error {
	return classified.New(classified.KindNotFound, fmt.Sprintf("volume %s not found", id), ErrNotFound)
}
