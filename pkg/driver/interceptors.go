package driver

import (
	"context"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/rpcerr"
)

// observeCalls records each RPC's duration and code in m.
func observeCalls(m *metrics.Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.RPCDone(info.FullMethod, status.Code(err).String(), time.Since(start))
		return resp, err
	}
}

// logCalls logs each RPC (with its volume, if any) at V(4) and its body, without secrets, at V(5). It
// also makes sure no plain Go error leaves a handler.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	logger := klog.FromContext(ctx).WithValues("method", info.FullMethod)
	if v, ok := req.(interface{ GetVolumeId() string }); ok && v.GetVolumeId() != "" {
		// Every line of the call names its volume, so one grep follows it.
		logger = logger.WithValues("volumeID", v.GetVolumeId())
	} else if v, ok := req.(*csi.CreateVolumeRequest); ok && v.GetName() != "" {
		// A volume is created under a name; its ID is the name and the
		// node's.
		logger = logger.WithValues("volumeName", v.GetName())
	}
	if logger.V(5).Enabled() {
		logger.V(5).Info("Request", "body", protosanitizer.StripSecrets(req).String())
	}
	ctx = klog.NewContext(ctx, logger)
	start := time.Now()
	resp, err := handler(ctx, req)
	err = rpcerr.ToGRPC(err)
	if err != nil {
		logger.V(2).Info("Call failed", "code", status.Code(err).String(), "message", status.Convert(err).Message(), "duration", time.Since(start))
	} else {
		logger.V(4).Info("Call succeeded", "duration", time.Since(start))
	}
	return resp, err
}

// recoverPanics turns a panic in a handler into an Internal error.
func recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			klog.FromContext(ctx).Error(nil, "Panic in handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
			err = rpcerr.ToGRPC(classified.Errorf(classified.KindInternal, "internal error in %s", info.FullMethod))
		}
	}()
	return handler(ctx, req)
}
