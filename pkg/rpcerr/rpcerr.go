// Package rpcerr turns the plugin's classified errors into gRPC statuses:
// the one table from a failure's kind to the code the CSI caller sees. The
// driver's interceptor applies it to every call's answer; handlers return
// domain errors (classified.Error) and never build a status themselves.
package rpcerr

import (
	"context"
	"errors"

	"github.com/converge-csi/converge/pkg/classified"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kindCodes is the gRPC code each kind of classified error answers with.
// Every kind has one (TestEveryKindHasItsCode); a kind missing here answers
// INTERNAL, never OK.
var kindCodes = map[classified.Kind]codes.Code{
	classified.KindInternal:           codes.Internal,
	classified.KindInvalidArgument:    codes.InvalidArgument,
	classified.KindNotFound:           codes.NotFound,
	classified.KindAlreadyExists:      codes.AlreadyExists,
	classified.KindFailedPrecondition: codes.FailedPrecondition,
	classified.KindResourceExhausted:  codes.ResourceExhausted,
	classified.KindAborted:            codes.Aborted,
	classified.KindDataLoss:           codes.DataLoss,
	classified.KindOutOfRange:         codes.OutOfRange,
	classified.KindUnavailable:        codes.Unavailable,
	classified.KindDeadlineExceeded:   codes.DeadlineExceeded,
	classified.KindCanceled:           codes.Canceled,
	classified.KindUnimplemented:      codes.Unimplemented,
}

// ToGRPC returns err as a gRPC status error, so that no plain Go error
// reaches the caller as UNKNOWN. A classified error (classified.Error) gets its
// kind's code; a gRPC status keeps its own; a context's end is
// DEADLINE_EXCEEDED or CANCELLED; anything else is INTERNAL. It returns nil
// for nil.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	var e *classified.Error
	if errors.As(err, &e) {
		code, ok := kindCodes[e.Kind]
		if !ok {
			return status.Errorf(codes.Internal, "unclassified failure (%s): %s", e.Kind, e.Message)
		}
		return status.Error(code, e.Message)
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

// Code is the code ToGRPC gives err: what a caller of the handler that
// returned it sees.
func Code(err error) codes.Code { return status.Code(ToGRPC(err)) }
