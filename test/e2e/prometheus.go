package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/converge-csi/converge/test/e2e/soak"
	polling "github.com/converge-csi/converge/test/testenv/poll"
)

// A Prometheus server beside the cluster, for the soak (soak_test.go): it
// evaluates the alert rules the chart ships (charts/converge/files/
// alerts.yaml and controller-alerts.yaml) as they are, their for: too, on
// what csi-node and converge-controller export, so that the soak can ask
// which alerts its faults set off and whether any is left once the cluster
// settles.
//   - It is Debian's (hack/prometheus.sh), run by the test process in the
//     host's network namespace on 127.0.0.1, its configuration and TSDB
//     under the run's directory: the run's clean-up ends it, as a process
//     that names that directory, if neither the test nor down has.
//   - Its targets are the pods the chart's PodMonitors
//     (templates/monitoring.yaml) have the Prometheus Operator scrape,
//     labelled as they label them, node among the labels (the alerts'
//     summaries name it): Debian builds Prometheus without Kubernetes
//     discovery, so the test process finds them and writes them into a
//     file per node, which Prometheus watches (prometheustargets.go).
//   - A pod's address is reached only from its node's network namespace:
//     each node's pods are a scrape pool of their own, scraped through the
//     node's proxy (nodeproxy.go).
//   - ConvergeNodeWriteRefused counts the API server's refusals by
//     deploy/'s node policies: the API server is scraped too, for that
//     counter alone.

const (
	// prometheusInterval is how often Prometheus scrapes its targets and
	// evaluates the rules: short beside the alerts' for: (5 to 30
	// minutes) and their ranges, so that a fault of seconds (a csi-node
	// killed and back) shows in a sample.
	prometheusInterval = 5 * time.Second
	// prometheusScrapeTimeout is under the interval, as Prometheus
	// requires: a csi-node stopped with SIGSTOP never answers.
	prometheusScrapeTimeout = 4 * time.Second
	// apiserverScrapeInterval is the API server's: its /metrics is
	// megabytes, of which one counter is kept, and the one alert on it
	// looks 15 minutes back.
	apiserverScrapeInterval = 15 * time.Second
	// prometheusUpTimeout bounds startPrometheus's wait for every target:
	// discovery, then a scrape interval, then a scrape.
	prometheusUpTimeout = 2 * time.Minute
)

// prometheusClient is the test process's client of Prometheus's API: no
// proxy, and a bound on every request, even one Prometheus never answers.
var prometheusClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}

// prometheusRules are the chart's rule files, relative to the repository.
var prometheusRules = []string{"charts/converge/files/alerts.yaml", "charts/converge/files/controller-alerts.yaml"}

// prometheus is a Prometheus server the test process runs.
type prometheus struct {
	proc    *proc
	url     string // its HTTP API's root: http://127.0.0.1:<port>
	proxies []*nodeProxy
	finder  *targetFinder
	// stopFinder ends finder's run; nil until it runs.
	stopFinder context.CancelFunc
	once       sync.Once
}

// alert is an alert that is pending or firing, as /api/v1/alerts lists
// it: an alert that is neither is not listed. It is the soak's, which
// keeps a log of them (soak.AlertLog).
type alert = soak.Alert

// startPrometheus starts a Prometheus that scrapes the csi-node and
// converge-controller pods of nodes, and waits until each node's csi-node
// and a converge-controller are scraped: the alerts mean nothing before.
// down stops it if the caller has not; ctx bounds the start alone.
func startPrometheus(ctx context.Context, nodes []*kubeNode) (*prometheus, error) {
	if len(nodes) == 0 {
		return nil, errors.New("startPrometheus: no nodes to scrape")
	}
	c := nodes[0].c
	bin, err := c.prometheusBinary(ctx)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.dir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &prometheus{}
	c.stopAtDown(p.stop)
	setup, err := p.reach(ctx, c, dir, nodes)
	if err == nil {
		err = p.run(ctx, c, bin, dir, setup)
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.node)
	}
	if err := p.waitTargets(ctx, names); err != nil {
		p.stop()
		return nil, fmt.Errorf("%w\n%s", err, tailFile(p.proc.log, 20))
	}
	return p, nil
}

// reach starts what takes Prometheus to the pods of nodes: a proxy into
// each node's network, and the finder of their targets, each node's in a
// file in dir, which it has written once when reach returns. It returns
// the configuration's setup.
func (p *prometheus) reach(ctx context.Context, c *cluster, dir string, nodes []*kubeNode) (prometheusSetup, error) {
	setup := prometheusSetup{apiserver: fmt.Sprintf("127.0.0.1:%d", c.ports["apiserver"]),
		ca: c.pki.path("ca.crt"), cert: c.pki.path("admin.crt"), key: c.pki.path("admin.key")}
	for _, r := range prometheusRules {
		setup.rules = append(setup.rules, filepath.Join(c.repo, r))
	}
	files := map[string]string{}
	for _, n := range nodes {
		// Not n.ns, which a reboot replaces while the proxy runs.
		kubeletDir := n.kubeletDir
		proxy, err := proxyInto(func() (string, error) { return liveNodeNetns(kubeletDir) })
		if err != nil {
			return setup, err
		}
		p.proxies = append(p.proxies, proxy)
		files[n.node] = filepath.Join(dir, "targets-"+n.node+".json")
		setup.nodes = append(setup.nodes, scrapeNode{name: n.node, proxy: proxy.url(), targets: files[n.node]})
	}
	finder, err := newTargetFinder(c.admin, files)
	if err != nil {
		return setup, err
	}
	if err := finder.pass(ctx); err != nil {
		return setup, err
	}
	p.finder = finder
	// Beyond ctx, which bounds the start: until stop.
	findCtx, cancel := context.WithCancel(context.Background())
	p.stopFinder = cancel
	go finder.run(findCtx)
	return setup, nil
}

// run writes the configuration of setup into dir and starts bin with it,
// on a free port of the host's loopback, and waits until it is ready.
func (p *prometheus) run(ctx context.Context, c *cluster, bin, dir string, setup prometheusSetup) error {
	config, err := setup.config()
	if err != nil {
		return err
	}
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, config, 0o644); err != nil {
		return err
	}
	port := 0
	for port == 0 || c.portTaken(port) {
		if port, err = freePort(); err != nil {
			return err
		}
	}
	p.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	p.proc, err = startProc(c.logs, "prometheus", bin, "--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	return waitFor(ctx, time.Minute, p.proc, func() error {
		resp, err := prometheusClient.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("prometheus is not ready: %s", resp.Status)
		}
		return nil
	})
}

// stop stops Prometheus and the proxies into the nodes. Stopping it again
// is a no-op.
func (p *prometheus) stop() {
	p.once.Do(func() {
		if p.proc != nil {
			p.proc.stop(20 * time.Second)
		}
		if p.stopFinder != nil {
			p.stopFinder()
			<-p.finder.done
		}
		for _, proxy := range p.proxies {
			proxy.close()
		}
	})
}

// alerts lists the alerts that are pending or firing now, by name and
// then labels.
func (p *prometheus) alerts(ctx context.Context) ([]alert, error) {
	var data struct {
		Alerts []struct {
			Labels   map[string]string `json:"labels"`
			State    string            `json:"state"`
			ActiveAt time.Time         `json:"activeAt"`
		} `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", &data); err != nil {
		return nil, err
	}
	out := make([]alert, 0, len(data.Alerts))
	for _, a := range data.Alerts {
		out = append(out, alert{Name: a.Labels["alertname"], Labels: a.Labels, State: a.State, ActiveAt: a.ActiveAt})
	}
	slices.SortFunc(out, func(a, b alert) int {
		if n := strings.Compare(a.Name, b.Name); n != 0 {
			return n
		}
		return strings.Compare(fmt.Sprint(a.Labels), fmt.Sprint(b.Labels))
	})
	return out, nil
}

// scrapeTarget is a target as /api/v1/targets lists it.
type scrapeTarget struct {
	Labels    map[string]string `json:"labels"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
	ScrapeURL string            `json:"scrapeUrl"`
}

// waitTargets waits until csi-node is scraped on each of nodes, and
// converge-controller on one of them at least (where it runs: the nodes of
// the control plane's role).
func (p *prometheus) waitTargets(ctx context.Context, nodes []string) error {
	// Every second: each answer lists every target.
	return polling.Wait(ctx, prometheusUpTimeout, time.Second, func() error {
		if p.proc.exited() {
			return polling.Stop(fmt.Errorf("prometheus exited (%v)", p.proc.err))
		}
		var data struct {
			ActiveTargets []scrapeTarget `json:"activeTargets"`
		}
		if err := p.get(ctx, "/api/v1/targets?state=active", &data); err != nil {
			return err
		}
		err := missingTargets(data.ActiveTargets, nodes)
		if ferr := p.finder.err(); err != nil && ferr != nil {
			err = fmt.Errorf("%w; the latest search for them failed: %v", err, ferr)
		}
		return err
	})
}

// missingTargets says which of the targets startPrometheus waits for are
// not up among targets, and why, or is nil.
func missingTargets(targets []scrapeTarget, nodes []string) error {
	up := map[string]bool{}
	var notes []string
	for _, t := range targets {
		if t.Health == "up" {
			up[t.Labels["job"]+"/"+t.Labels["node"]] = true
			up[t.Labels["job"]] = true
			continue
		}
		notes = append(notes, fmt.Sprintf("%s %s (%s %s): %s", t.Labels["job"], t.ScrapeURL, t.Labels["node"], t.Health, t.LastError))
	}
	var missing []string
	for _, n := range nodes {
		if !up[daemonSetName+"/"+n] {
			missing = append(missing, daemonSetName+" of "+n)
		}
	}
	if !up[controllerName] {
		missing = append(missing, controllerName)
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("prometheus does not scrape %s yet; of %d targets, these are not up: %v", strings.Join(missing, ", "), len(targets), notes)
}

// get decodes the data of a successful answer of Prometheus's HTTP API at
// path into data.
func (p *prometheus) get(ctx context.Context, path string, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path, nil)
	if err != nil {
		return err
	}
	resp, err := prometheusClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var answer struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return fmt.Errorf("prometheus %s: %s: %w", path, resp.Status, err)
	}
	if answer.Status != "success" {
		return fmt.Errorf("prometheus %s: %s: %s", path, resp.Status, answer.Error)
	}
	return json.Unmarshal(answer.Data, data)
}

// prometheusBinary is the path of Debian's Prometheus server
// (hack/prometheus.sh prometheus), unpacked into the user's cache
// directory once, or found there: make test's e2e build step fetches it
// (buildAll), so that a run's tests do not.
func (c *cluster) prometheusBinary(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.repo, "hack", "prometheus.sh"), "prometheus")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/prometheus.sh prometheus: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	// The script says so when it downloaded the package.
	if strings.Contains(stderr.String(), "unpacked") {
		c.builtMu.Lock()
		c.built = append(c.built, "prometheus")
		c.builtMu.Unlock()
	}
	return strings.TrimSpace(string(out)), nil
}

// scraped says whether every scrape of the node's csi-node in the last
// window (15 s at least) succeeded: its up series was 1 throughout (and there was one).
// A scrape that failed, or a csi-node whose pod was not found to scrape,
// answers false.
func (p *prometheus) scraped(ctx context.Context, node string, window time.Duration) (bool, error) {
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	// A window of at least a few scrapes: a shorter one may hold none.
	q := fmt.Sprintf(`min_over_time(up{container="csi-node",node=%q}[%ds])`, node, max(int(window.Seconds()), 15))
	if err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(q), &data); err != nil {
		return false, err
	}
	for _, r := range data.Result {
		if v, _ := r.Value[1].(string); v != "1" {
			return false, nil
		}
	}
	return len(data.Result) > 0, nil
}
