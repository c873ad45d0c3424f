package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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
// (pkg/classagent) rather than the controller: one per node, in a pod of
// its own beside the node's csi-node, with an account that only reads.
const nodeAgentCommand = "node-agent"

// modifyTimeout bounds one ControllerModifyVolume call to csi-node, which
// records the limits and answers: it waits for nothing else.
const modifyTimeout = 30 * time.Second

// capsRecheck is how often the agent asks csi-node again whether it
// serves ControllerModifyVolume. The agent runs in a pod of its own, so a
// change of csi-node's ModifyVolume gate restarts csi-node and not the
// agent: the agent follows the gate within this, and one question a
// minute costs csi-node nothing.
const capsRecheck = time.Minute

// defaultAgentHTTPAddress serves the node agent's probes and metrics. Its
// pod is on the pod network, beside csi-node's (9810, the registrar's
// 9809) and converge-controller's (9812), none of which it can clash
// with; a port of its own keeps a NetworkPolicy or a scrape from taking
// one for another.
const defaultAgentHTTPAddress = ":9813"

// nodeAgent parses the node agent's flags (args, after its command) and
// runs it until ctx ends.
func nodeAgent(ctx context.Context, args []string) error {
	f, err := parseAgentFlags(args)
	if err != nil {
		return err
	}
	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "converge-node-agent/" + buildinfo.Version(version)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(f.csiAddress, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("csi-node at %s: %w", f.csiAddress, err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	modify := func(ctx context.Context, h classagent.Hand) error {
		ctx, cancel := context.WithTimeout(ctx, modifyTimeout)
		defer cancel()
		_, err := ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: h.VolumeID, MutableParameters: h.Params})
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := classagent.NewMetrics(reg)
	ready := newReadiness(f.csiAddress)
	// A failure of the HTTP server ends the agent, as it ends the
	// controller: its probes would fail anyway, later and less clearly.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	if f.httpAddress != "" {
		ln, err := net.Listen("tcp", f.httpAddress)
		if err != nil {
			return err
		}
		serve(ctx, ln, reg, ready.checks(), fail)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	events := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "converge-node-agent", Host: f.scope.Node})
	loop := classLoop{ctrl: ctrl, csiAddress: f.csiAddress, ready: ready, recheck: capsRecheck,
		run: func(ctx context.Context, synced func()) error {
			return classagent.New(classagent.Config{Client: client, Scope: f.scope, Modify: modify, Resync: f.resync,
				Events: events, Synced: synced, Metrics: metrics}).Run(ctx)
		}}
	err = loop.loop(ctx)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// classLoop runs an agent while csi-node advertises MODIFY_VOLUME, and
// holds ready to what it finds.
type classLoop struct {
	ctrl       csi.ControllerClient
	csiAddress string
	ready      *readiness
	// recheck is how often csi-node is asked again whether it serves
	// ControllerModifyVolume (capsRecheck).
	recheck time.Duration
	// run runs an agent until ctx ends, calling synced once its caches
	// filled.
	run func(ctx context.Context, synced func()) error
}

// loop asks csi-node, runs an agent while it advertises MODIFY_VOLUME and
// watches nothing while it does not, until ctx ends; it returns an
// agent's error.
func (l classLoop) loop(ctx context.Context) error {
	for told := false; ; {
		on, err := modifyAdvertised(ctx, l.ctrl, l.ready)
		if err != nil {
			return nil // ctx ended: stopped while waiting
		}
		if !on {
			// Idle, and rightly: ready, with nothing to hand.
			l.ready.filling("")
			// With ModifyVolume off the agent watches nothing, and
			// asks again: turning the gate on restarts csi-node, not
			// this pod.
			if !told {
				klog.InfoS("csi-node does not advertise MODIFY_VOLUME (turned off by --feature-gates=ModifyVolume=false, or a release without it): nothing to hand; asking again every minute", "csiAddress", l.csiAddress)
				told = true
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(l.recheck):
			}
			continue
		}
		told = false
		l.ready.filling("the caches of PersistentVolumes, claims and VolumeAttributesClasses are not filled yet")
		run, stop := context.WithCancel(ctx)
		withdrawn := make(chan struct{})
		go func() {
			defer close(withdrawn)
			if untilWithdrawn(run, l.ctrl, l.recheck, l.ready) {
				stop()
			}
		}()
		err = l.run(run, func() { l.ready.filling("") })
		stop()
		<-withdrawn
		if err != nil || ctx.Err() != nil {
			return err
		}
		klog.InfoS("csi-node no longer advertises MODIFY_VOLUME: stopped handing classes", "csiAddress", l.csiAddress)
	}
}

// modifyAdvertised asks csi-node, until it answers or ctx ends, whether
// it serves ControllerModifyVolume; ready follows each answer.
func modifyAdvertised(ctx context.Context, ctrl csi.ControllerClient, ready *readiness) (bool, error) {
	for waited := 0; ; {
		on, err := askModify(ctx, ctrl)
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		ready.asked(err)
		if err == nil {
			return on, nil
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

// untilWithdrawn asks csi-node every period whether it still serves
// ControllerModifyVolume, and returns true once it answers that it does
// not; false when ctx ends first. A question csi-node does not answer (it
// restarts) is asked again at the next period, and ready follows each
// answer: the agent's hands do not reach a csi-node that does not answer.
func untilWithdrawn(ctx context.Context, ctrl csi.ControllerClient, every time.Duration, ready *readiness) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		on, err := askModify(ctx, ctrl)
		if ctx.Err() != nil {
			return false
		}
		ready.asked(err)
		if err == nil && !on {
			return true
		}
	}
}

// askModify asks csi-node once whether it advertises MODIFY_VOLUME. A
// csi-node without a controller service (UNIMPLEMENTED) does not.
func askModify(ctx context.Context, ctrl csi.ControllerClient) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, modifyTimeout)
	defer cancel()
	resp, err := ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if status.Code(err) == codes.Unimplemented {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME {
			return true, nil
		}
	}
	return false, nil
}

// agentFlags are the node agent's flags.
type agentFlags struct {
	scope                               classagent.Scope
	kubeconfig, csiAddress, httpAddress string
	resync                              time.Duration
}

// parseAgentFlags parses the node agent's arguments.
func parseAgentFlags(args []string) (agentFlags, error) {
	fs := flag.NewFlagSet(nodeAgentCommand, flag.ContinueOnError)
	f := agentFlags{scope: classagent.Scope{TopologyKey: contract.TopologyKey}}
	fs.DurationVar(&f.resync, "resync-period", 10*time.Minute, "how often every volume of the node is handed its class again")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: the pod's service account)")
	fs.StringVar(&f.scope.Driver, "driver-name", contract.DefaultDriverName, "CSI driver whose volumes to hand their class")
	fs.StringVar(&f.scope.Node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&f.csiAddress, "csi-address", "/csi/csi.sock", "csi-node's socket on this node")
	fs.StringVar(&f.httpAddress, "http-address", defaultAgentHTTPAddress, "host:port serving /metrics, /healthz (the process serves) and /readyz (csi-node answered, and the caches filled where it serves ControllerModifyVolume) (empty: none)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.scope.Node == "" {
		return f, errors.New("--node-name (or $NODE_NAME) is required")
	}
	if f.resync <= 0 {
		return f, errors.New("--resync-period must be positive")
	}
	return f, nil
}
