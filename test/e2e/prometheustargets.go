package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The run's Prometheus (prometheus.go) is Debian's, built without
// Kubernetes discovery: the test process finds the converge pods in the
// API server itself, as the chart's PodMonitors (templates/monitoring.yaml)
// have the Prometheus Operator find them, and writes each node's into a
// file of its own, which Prometheus watches (file_sd_configs). A pod is a
// target at the port those PodMonitors name, labelled as they label it:
// job its app.kubernetes.io/name, node its node (the alerts' summaries name
// it), namespace, pod and container.

// scrapePorts are the converge pods that are scraped, by their
// app.kubernetes.io/name, and the name of the port each is scraped at.
var scrapePorts = map[string]string{daemonSetName: "metrics", controllerName: "http-metrics"}

// targetGroup is a group of targets of a file_sd file.
type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// podTargets are the scrape targets among pods, by node. A pod without an
// address yet, or that has ended, has none.
func podTargets(pods []corev1.Pod) map[string][]targetGroup {
	out := map[string][]targetGroup{}
	for _, pod := range pods {
		port := scrapePorts[pod.Labels["app.kubernetes.io/name"]]
		if port == "" || pod.Status.PodIP == "" || pod.Spec.NodeName == "" ||
			pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ctr := range pod.Spec.Containers {
			for _, p := range ctr.Ports {
				if p.Name != port {
					continue
				}
				out[pod.Spec.NodeName] = append(out[pod.Spec.NodeName], targetGroup{
					Targets: []string{net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(p.ContainerPort)))},
					Labels: map[string]string{"job": pod.Labels["app.kubernetes.io/name"], "node": pod.Spec.NodeName,
						"namespace": pod.Namespace, "pod": pod.Name, "container": ctr.Name},
				})
			}
		}
	}
	for _, groups := range out {
		slices.SortFunc(groups, func(a, b targetGroup) int { return strings.Compare(a.Labels["pod"], b.Labels["pod"]) })
	}
	return out
}

// targetFinder writes the scrape targets of each node's converge pods
// into the node's file.
type targetFinder struct {
	client kubernetes.Interface
	files  map[string]string // by node name
	done   chan struct{}     // closed when run returns
	// mu guards lastErr.
	mu      sync.Mutex
	lastErr error // of the latest pass, nil if it succeeded
}

// newTargetFinder makes a targetFinder for files, with a client of its own
// from the admin's kubeconfig: the soak's restart of the API server
// replaces the cluster's.
func newTargetFinder(kubeconfig string, files map[string]string) (*targetFinder, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// A pass never outlasts a few intervals, even against an API server
	// that accepts and does not answer.
	cfg.Timeout = 3 * prometheusInterval
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &targetFinder{client: client, files: files, done: make(chan struct{})}, nil
}

// run does a pass every prometheusInterval until ctx ends. A pass that
// fails (the API server down) leaves the files as they are.
func (f *targetFinder) run(ctx context.Context) {
	defer close(f.done)
	tick := time.NewTicker(prometheusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := f.pass(ctx)
		f.mu.Lock()
		f.lastErr = err
		f.mu.Unlock()
	}
}

// err is the error of the latest pass, or nil.
func (f *targetFinder) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// pass lists the converge pods and writes each node's targets into its
// file, rewriting only a file whose targets changed.
func (f *targetFinder) pass(ctx context.Context) error {
	var apps []string
	for app := range scrapePorts {
		apps = append(apps, app)
	}
	slices.Sort(apps)
	pods, err := f.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name in (" + strings.Join(apps, ",") + ")"})
	if err != nil {
		return fmt.Errorf("listing the converge pods: %w", err)
	}
	targets := podTargets(pods.Items)
	for node, file := range f.files {
		if err := writeTargets(file, targets[node]); err != nil {
			return err
		}
	}
	return nil
}

// writeTargets writes groups into the file_sd file at path unless it holds
// them already. The file is replaced whole (a rename): Prometheus never
// reads half of one.
func writeTargets(path string, groups []targetGroup) error {
	if groups == nil {
		groups = []targetGroup{}
	}
	b, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	tmp := path + ".partial"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
