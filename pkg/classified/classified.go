package classified

import (
	"errors"
	"fmt"
)

// Kind classifies a failure the way the CSI answer must classify it;
// pkg/rpcerr maps each kind to the gRPC code of the same name.
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
	// KindUnavailable is a volume or request that cannot be served now
	// and may be retried as it is (an unusable mount, an intent that
	// could not be made durable).
	KindUnavailable
	// KindDeadlineExceeded is a request whose wait ended before the
	// volume converged; the work goes on.
	KindDeadlineExceeded
	// KindCanceled is a request its caller gave up; the work goes on.
	KindCanceled
	// KindUnimplemented is a call this plugin does not serve as
	// configured.
	KindUnimplemented

	// numKinds counts the kinds: every kind is declared above it.
	numKinds
)

// Kinds returns every kind, in order: what a table of kinds must cover.
func Kinds() []Kind {
	all := make([]Kind, numKinds)
	for k := range all {
		all[k] = Kind(k)
	}
	return all
}

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
	KindUnavailable:        "Unavailable",
	KindDeadlineExceeded:   "DeadlineExceeded",
	KindCanceled:           "Canceled",
	KindUnimplemented:      "Unimplemented",
}

// String returns the kind's name, "Kind(N)" for a kind without one.
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is a classified failure. A Terminal error is final: the reconciler
// withdraws the intent instead of retrying it. It wraps its causes, the
// errors its message was made with by %w, so that errors.Is and errors.As
// see through it.
type Error struct {
	Kind     Kind
	Terminal bool
	Message  string
	causes   []error
}

// Error implements error.
func (e *Error) Error() string { return e.Message }

// Unwrap returns the errors e was made from.
func (e *Error) Unwrap() []error { return e.causes }

// Errorf returns a non-terminal error of the given kind. As with
// fmt.Errorf, the operands of %w are its causes.
func Errorf(kind Kind, format string, args ...any) *Error {
	return newError(kind, false, format, args)
}

// Terminalf returns a terminal error of the given kind; the operands of %w
// are its causes.
func Terminalf(kind Kind, format string, args ...any) *Error {
	return newError(kind, true, format, args)
}

// New returns a non-terminal error of the given kind whose message is
// message as it is, wrapping causes (which its message need not spell,
// unlike Errorf's %w): for a sentinel a caller tests with errors.Is, as
// state.NotFound wraps state.ErrNotFound.
func New(kind Kind, message string, causes ...error) *Error {
	return &Error{Kind: kind, Message: message, causes: causes}
}

func newError(kind Kind, terminal bool, format string, args []any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Kind: kind, Terminal: terminal, Message: err.Error()}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		e.causes = []error{u.Unwrap()}
	case interface{ Unwrap() []error }:
		e.causes = u.Unwrap()
	}
	return e
}

// AsError returns err as an *Error; any other error becomes a transient
// KindInternal error carrying err's message and wrapping it. It returns nil
// for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: KindInternal, Message: err.Error(), causes: []error{err}}
}
