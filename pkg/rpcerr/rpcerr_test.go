package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// TestEveryKindHasItsCode covers every kind state declares, including
// those added after this test: each answers with the gRPC code of its own
// name, and never OK.
func TestEveryKindHasItsCode(t *testing.T) {
	kinds := classified.Kinds()
	if len(kinds) < 13 {
		t.Fatalf("got %d kinds, want at least the 13 of today", len(kinds))
	}
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			err := ToGRPC(classified.Errorf(k, "failed"))
			if err == nil {
				t.Fatal("got nil, want an error")
			}
			s := status.Convert(err)
			if s.Code() != kindCodes[k] || s.Code().String() != k.String() {
				t.Errorf("got %s, want the code named %s", s.Code(), k)
			}
			if s.Code() == codes.OK || s.Code() == codes.Unknown {
				t.Errorf("got %s, want a code that says what failed", s.Code())
			}
			if s.Message() != "failed" {
				t.Errorf("got message %q, want %q", s.Message(), "failed")
			}
		})
	}
}

// TestUnknownKindIsInternal shows a kind missing from the table can never
// answer OK.
func TestUnknownKindIsInternal(t *testing.T) {
	err := ToGRPC(&classified.Error{Kind: classified.Kind(1000), Message: "odd"})
	if got := status.Code(err); got != codes.Internal {
		t.Errorf("got %s, want Internal", got)
	}
}

func TestToGRPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{name: "nil", err: nil, want: codes.OK},
		{name: "wrapped classified", err: fmt.Errorf("staging: %w", state.NotFound("v")), want: codes.NotFound},
		{name: "status kept", err: status.Error(codes.Aborted, "x"), want: codes.Aborted},
		{name: "deadline", err: fmt.Errorf("waiting: %w", context.DeadlineExceeded), want: codes.DeadlineExceeded},
		{name: "canceled", err: context.Canceled, want: codes.Canceled},
		{name: "plain", err: errors.New("boom"), want: codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Code(tc.err); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
