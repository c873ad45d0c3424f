package classified

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// TestErrorWrapsItsCause checks that a classified error keeps what it was
// made from, for errors.Is and errors.As.
func TestErrorWrapsItsCause(t *testing.T) {
	cause := os.ErrPermission
	other := errors.New("second cause")
	if e := Terminalf(KindFailedPrecondition, "growing: %w", cause); !errors.Is(e, cause) || e.Message != "growing: "+cause.Error() {
		t.Errorf("Terminalf with %%w: %v does not wrap %v", e, cause)
	}
	if e := Errorf(KindInternal, "a: %w; b: %w", cause, other); !errors.Is(e, cause) || !errors.Is(e, other) {
		t.Errorf("Errorf with two %%w: %v does not wrap both", e)
	}
	if e := Errorf(KindInternal, "only text: %v", cause); errors.Is(e, cause) {
		t.Errorf("Errorf with %%v wraps %v", cause)
	}
	wrapped := fmt.Errorf("context: %w", cause)
	if e := AsError(wrapped); e.Kind != KindInternal || !errors.Is(e, cause) {
		t.Errorf("AsError(%v) = %+v, want KindInternal wrapping it", wrapped, e)
	}
	inner := Terminalf(KindDataLoss, "lost: %w", cause)
	if e := AsError(fmt.Errorf("outer: %w", inner)); e != inner {
		t.Errorf("AsError did not find the classified error inside: %+v", e)
	}
}

// TestNewKeepsItsMessage checks that New wraps its causes without spelling
// them: the message is the caller's, as it is.
func TestNewKeepsItsMessage(t *testing.T) {
	sentinel := errors.New("volume not found")
	e := New(KindNotFound, "volume v not found", sentinel)
	if e.Kind != KindNotFound || e.Terminal || e.Message != "volume v not found" || !errors.Is(e, sentinel) {
		t.Errorf("New: got %+v, want a non-terminal NotFound \"volume v not found\" wrapping %v", e, sentinel)
	}
	if e := New(KindInternal, "alone"); e.Unwrap() != nil {
		t.Errorf("New without causes: Unwrap() = %v, want nil", e.Unwrap())
	}
}
