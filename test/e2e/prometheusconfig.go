package e2e

import (
	"time"

	"sigs.k8s.io/yaml"
)

// prometheusSetup is what the run's Prometheus configuration
// (prometheus.go) is made of.
type prometheusSetup struct {
	nodes     []scrapeNode
	apiserver string   // the API server's host:port
	ca        string   // the cluster's CA, which signs the API server's certificate
	cert, key string   // the admin's client certificate and key, to scrape the API server
	rules     []string // the rule files
}

// scrapeNode is a node whose pods are scraped through a proxy into its
// network (nodeproxy.go).
type scrapeNode struct {
	name    string
	proxy   string // the proxy's URL
	targets string // the file of its targets
}

// config is the Prometheus configuration of s, as YAML.
func (s prometheusSetup) config() ([]byte, error) {
	pools := []any{s.apiserverPool()}
	for _, n := range s.nodes {
		pools = append(pools, s.podPool(n))
	}
	return yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval":     prometheusInterval.String(),
			"scrape_timeout":      prometheusScrapeTimeout.String(),
			"evaluation_interval": prometheusInterval.String(),
		},
		"rule_files":     s.rules,
		"scrape_configs": pools,
	})
}

// podPool is the scrape pool of node n's converge pods, whose targets the
// test process writes into n.targets (prometheustargets.go): Debian's
// Prometheus has no Kubernetes discovery of its own.
func (s prometheusSetup) podPool(n scrapeNode) map[string]any {
	return map[string]any{
		"job_name":  "converge-pods-of-" + n.name,
		"proxy_url": n.proxy,
		"file_sd_configs": []any{map[string]any{
			"files": []string{n.targets},
			// Besides its watch of the file.
			"refresh_interval": prometheusInterval.String(),
		}},
	}
}

// apiserverPool is the scrape pool of the API server, of which only the
// validating admission policies' counter is kept: ConvergeNodeWriteRefused
// reads it.
func (s prometheusSetup) apiserverPool() map[string]any {
	return map[string]any{
		"job_name":        "apiserver",
		"scheme":          "https",
		"scrape_interval": apiserverScrapeInterval.String(),
		"scrape_timeout":  (apiserverScrapeInterval - time.Second).String(),
		"tls_config":      map[string]any{"ca_file": s.ca, "cert_file": s.cert, "key_file": s.key},
		"static_configs":  []any{map[string]any{"targets": []string{s.apiserver}}},
		"metric_relabel_configs": []any{map[string]any{
			"action": "keep", "source_labels": []string{"__name__"}, "regex": "apiserver_validating_admission_policy_check_total",
		}},
	}
}
