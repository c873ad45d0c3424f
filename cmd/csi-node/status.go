package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converge-csi/converge/pkg/driver"
	"github.com/converge-csi/converge/pkg/status"
)

// FetchStatus asks a running plugin for the volumes as of its last pass,
// over its status socket in stateDir, or over httpAddress when it is set.
// It never opens the store, so it works while the plugin runs and is busy.
func FetchStatus(ctx context.Context, stateDir, httpAddress string) ([]status.VolumeStatus, error) {
	url := "http://" + httpAddress + "/status"
	client := &http.Client{Timeout: 10 * time.Second}
	if httpAddress == "" {
		sock := driver.StatusSocket(stateDir)
		url = "http://converge/status"
		client.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking the plugin (is it running with this state directory?): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the plugin answered %s", resp.Status)
	}
	var out []status.VolumeStatus
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("reading the status: %w", err)
	}
	return out, nil
}

// PrintStatus writes volumes as a table (volume, phase, staged at,
// publishes fulfilled/desired, size, condition or last error, next retry),
// or as JSON.
func PrintStatus(w io.Writer, volumes []status.VolumeStatus, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(volumes)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tPHASE\tSTAGED AT\tPUBLISHES\tSIZE\tPROBLEM\tNEXT RETRY")
	for _, v := range volumes {
		staged := v.StagingPath
		if staged == "" {
			staged = "-"
		} else if !v.Staged {
			staged += " (not yet)"
		}
		problem := "-"
		switch {
		case v.Reason != "":
			problem = v.Reason + ": " + v.Message
		case v.LastError != "":
			problem = fmt.Sprintf("%s (%d attempts)", v.LastError, v.Attempts)
		}
		retry := "-"
		if !v.NextRetry.IsZero() {
			retry = v.NextRetry.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", v.ID, v.Phase, staged, v.PublishesActual, v.PublishesDesired,
			size(v.SizeBytes), strings.ReplaceAll(problem, "\n", " "), retry)
	}
	return tw.Flush()
}

func size(b int64) string {
	switch {
	case b == 0:
		return "-"
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGi", float64(b)/(1<<30))
	default:
		return fmt.Sprintf("%dMi", b>>20)
	}
}
