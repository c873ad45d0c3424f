package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/buildinfo"
	"github.com/converge-csi/converge/pkg/classagent"
	"github.com/converge-csi/converge/pkg/contract"
)

// nodeAgentCommand is the first argument that runs the node agent
// (pkg/classagent) rather than the controller: one per node, beside
// csi-node, with the node's credentials.
const nodeAgentCommand = "node-agent"

// modifyTimeout bounds one ControllerModifyVolume call to csi-node, which
// records the limits and answers: it waits for nothing else.
const modifyTimeout = 30 * time.Second

// nodeAgent parses the node agent's flags (args, after its command) and
// runs it until ctx ends.
func nodeAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(nodeAgentCommand, flag.ContinueOnError)
	var kubeconfig, csiAddress string
	scope := classagent.Scope{TopologyKey: contract.TopologyKey}
	resync := fs.Duration("resync-period", 10*time.Minute, "how often every volume of the node is handed its class again")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (empty: the pod's service account)")
	fs.StringVar(&scope.Driver, "driver-name", contract.DefaultDriverName, "CSI driver whose volumes to hand their class")
	fs.StringVar(&scope.Node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&csiAddress, "csi-address", "/csi/csi.sock", "csi-node's socket on this node")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if scope.Node == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	if *resync <= 0 {
		return errors.New("--resync-period must be positive")
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "converge-node-agent/" + buildinfo.Version(version)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(csiAddress, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("csi-node at %s: %w", csiAddress, err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	on, err := modifyAdvertised(ctx, ctrl)
	if err != nil {
		return nil // ctx ended: stopped while waiting
	}
	if !on {
		// The DaemonSet runs the agent whatever csi-node's gates: with
		// ModifyVolume off it watches nothing. A change of the gate
		// changes the pod, and so starts the agent again.
		klog.InfoS("csi-node does not advertise MODIFY_VOLUME (--feature-gates=ModifyVolume=false turned it off): nothing to hand", "csiAddress", csiAddress)
		<-ctx.Done()
		return nil
	}
	modify := func(ctx context.Context, h classagent.Hand) error {
		ctx, cancel := context.WithTimeout(ctx, modifyTimeout)
		defer cancel()
		_, err := ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: h.VolumeID, MutableParameters: h.Params})
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	events := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "converge-node-agent", Host: scope.Node})
	return classagent.New(classagent.Config{Client: client, Scope: scope, Modify: modify, Resync: *resync, Events: events}).Run(ctx)
}

// modifyAdvertised asks csi-node, until it answers or ctx ends, whether
// it serves ControllerModifyVolume.
func modifyAdvertised(ctx context.Context, ctrl csi.ControllerClient) (bool, error) {
	for waited := 0; ; {
		call, cancel := context.WithTimeout(ctx, modifyTimeout)
		resp, err := ctrl.ControllerGetCapabilities(call, &csi.ControllerGetCapabilitiesRequest{})
		cancel()
		if err == nil {
			for _, c := range resp.GetCapabilities() {
				if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME {
					return true, nil
				}
			}
			return false, nil
		}
		if waited == 0 {
			klog.InfoS("Waiting for csi-node to answer", "err", err)
		}
		waited++
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
