package nodeserver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/state"
)

// Status turns any error into a gRPC status error, so that no plain Go error
// reaches the kubelet as Unknown: the one place a code is chosen, for the
// node and the controller alike (the driver's interceptor applies it to
// every call) besides state.Error's GRPCStatus. A classified error gets its
// kind's code; a gRPC status keeps its own.
func Status(err error) error {
	if err == nil {
		return nil
	}
	// A classified error (state.Error) carries its kind's code.
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

func invalid(format string, args ...any) error {
	return state.Errorf(state.KindInvalidArgument, format, args...)
}
