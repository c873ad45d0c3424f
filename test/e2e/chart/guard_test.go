package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/capacity"
)

// TestGuardSchemaIsTheParser checks that values.schema.json and csi-node's
// parser agree on what a guard may be: both of the schema's guards
// (csiNode.poolGuard, pools[].guard) hold capacity.GuardPattern, which
// ParseGuard reads, and a table of guards, rendered through each, is
// accepted by the chart exactly when csi-node accepts it. A value the
// chart accepts and csi-node refuses stops csi-node at start-up, on every
// node.
func TestGuardSchemaIsTheParser(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			CSINode struct {
				Properties struct {
					PoolGuard struct {
						AnyOf []struct {
							Type    string `json:"type"`
							Pattern string `json:"pattern"`
						} `json:"anyOf"`
					} `json:"poolGuard"`
				} `json:"properties"`
			} `json:"csiNode"`
			Pools struct {
				Items struct {
					Properties struct {
						Guard struct {
							Pattern string `json:"pattern"`
						} `json:"guard"`
					} `json:"properties"`
				} `json:"items"`
			} `json:"pools"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, a := range schema.Properties.CSINode.Properties.PoolGuard.AnyOf {
		if a.Type == "string" {
			patterns = append(patterns, a.Pattern)
		}
	}
	patterns = append(patterns, schema.Properties.Pools.Items.Properties.Guard.Pattern)
	if len(patterns) != 2 || patterns[0] != capacity.GuardPattern || patterns[1] != capacity.GuardPattern {
		t.Errorf("the schema's guard patterns %q, want both csi-node's %q", patterns, capacity.GuardPattern)
	}

	for _, g := range []string{"5%", "0%", "12.5%", "99.9%", "100%", "150%", "5.%", ".5%", " 5%", "5",
		"2Gi", "512Mi", "2G", "2k", "2M", "2T", "-1", "1.5Gi", "999999Ti", "1000000Ti", "9223372036854775807", "lots", ""} {
		_, perr := capacity.ParseGuard(g)
		for where, vals := range map[string]map[string]any{
			"csiNode.poolGuard": {"csiNode": map[string]any{"poolGuard": g}},
			"pools[].guard":     {"pools": []any{map[string]any{"name": "fast", "guard": g}}},
		} {
			_, rerr := render(t, vals)
			if (rerr == nil) != (perr == nil) {
				t.Errorf("guard %q: the chart's %s says %v, csi-node's parser %v", g, where, rerr, perr)
			}
			if rerr != nil && !strings.Contains(rerr.Error(), "uard") {
				t.Errorf("guard %q: the chart's %s refuses it with %v, which names no guard", g, where, rerr)
			}
		}
	}
}
