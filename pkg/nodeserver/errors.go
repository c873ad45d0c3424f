package nodeserver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/state"
)

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
// reaches the kubelet as Unknown. A gRPC status passes through unchanged.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var e *state.Error
	switch {
	case errors.As(err, &e):
		return status.Error(kindCodes[e.Kind], e.Message)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
