package nodeserver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/state"
)

// kindCodes is the gRPC code each kind of classified error answers with.
var kindCodes = map[state.Kind]codes.Code{
	state.KindInternal:           codes.Internal,
	state.KindInvalidArgument:    codes.InvalidArgument,
	state.KindNotFound:           codes.NotFound,
	state.KindAlreadyExists:      codes.AlreadyExists,
	state.KindFailedPrecondition: codes.FailedPrecondition,
	state.KindResourceExhausted:  codes.ResourceExhausted,
	state.KindAborted:            codes.Aborted,
	state.KindDataLoss:           codes.DataLoss,
	state.KindOutOfRange:         codes.OutOfRange,
}

// Status turns any error into a gRPC status error, so that no plain Go error
// reaches the kubelet as Unknown: the one place a code is chosen, for the
// node and the controller alike (the driver's interceptor applies it to
// every call). A classified error (state.Error) gets its kind's code; a
// gRPC status keeps its own.
func Status(err error) error {
	if err == nil {
		return nil
	}
	var e *state.Error
	if errors.As(err, &e) {
		return status.Error(kindCodes[e.Kind], e.Message)
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// invalid is the answer to a request that is not valid.
func invalid(format string, args ...any) error {
	return Status(state.Errorf(state.KindInvalidArgument, format, args...))
}

// notFound is the answer for a volume this node does not know.
func notFound(id string) error { return Status(state.NotFound(id)) }
