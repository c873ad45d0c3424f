package state

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned when a volume has no record.
var ErrNotFound = errors.New("volume not found")

// Kind classifies a failure the way the CSI answer must classify it;
// pkg/nodeserver maps each kind to a gRPC code.
type Kind int

const (
	// KindInternal is an unexpected failure.
	KindInternal Kind = iota
	// KindInvalidArgument is a request the plugin will never satisfy.
	KindInvalidArgument
	// KindNotFound is a volume or device that does not exist.
	KindNotFound
	// KindAlreadyExists is a conflict with what is already there.
	KindAlreadyExists
	// KindFailedPrecondition is a state that forbids the operation.
	KindFailedPrecondition
	// KindResourceExhausted is a lack of devices, space or memory.
	KindResourceExhausted
	// KindAborted is an intent superseded by another request.
	KindAborted
	// KindDataLoss is a device that lost the filesystem it carried.
	KindDataLoss
	// KindOutOfRange is a size beyond what is possible.
	KindOutOfRange
)

var kindNames = map[Kind]string{
	KindInternal:           "Internal",
	KindInvalidArgument:    "InvalidArgument",
	KindNotFound:           "NotFound",
	KindAlreadyExists:      "AlreadyExists",
	KindFailedPrecondition: "FailedPrecondition",
	KindResourceExhausted:  "ResourceExhausted",
	KindAborted:            "Aborted",
	KindDataLoss:           "DataLoss",
	KindOutOfRange:         "OutOfRange",
}

// String returns the kind's name.
func (k Kind) String() string { return kindNames[k] }

// Error is a classified failure. A Terminal error is final: the reconciler
// withdraws the intent instead of retrying it.
type Error struct {
	Kind     Kind
	Terminal bool
	Message  string
}

// Error implements error.
func (e *Error) Error() string { return e.Message }

// Errorf returns a non-terminal error of the given kind.
func Errorf(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// Terminalf returns a terminal error of the given kind.
func Terminalf(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Terminal: true, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error; any other error becomes a transient
// KindInternal error carrying err's message. It returns nil for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: KindInternal, Message: err.Error()}
}
