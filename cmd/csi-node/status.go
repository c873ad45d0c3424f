package main

import (
	"bytes"
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
	"github.com/converge-csi/converge/pkg/volstatus"
)

// Status is what csi-node status prints.
type Status struct {
	Pools   []volstatus.PoolStatus   `json:"pools"`
	Volumes []volstatus.VolumeStatus `json:"volumes"`
}

// FetchStatus asks a running plugin for its storage pools' space and the
// volumes as of its last pass.
func FetchStatus(ctx context.Context, stateDir, httpAddress string) (Status, error) {
	var s Status
	if err := fetch(ctx, stateDir, httpAddress, "/status/pools", &s.Pools); err != nil {
		return s, err
	}
	return s, fetch(ctx, stateDir, httpAddress, "/status", &s.Volumes)
}

// fetch gets path from a running plugin into out, over its status socket
// in stateDir, or over httpAddress when it is set. It never opens the
// store, so it works while the plugin runs and is busy.
func fetch(ctx context.Context, stateDir, httpAddress, path string, out any) error {
	return ask(ctx, stateDir, httpAddress, http.MethodGet, path, nil, out, 10*time.Second)
}

// ask sends a request with the JSON of in (nil: none) to a running plugin
// and reads its JSON answer into out, within timeout.
func ask(ctx context.Context, stateDir, httpAddress, method, path string, in, out any, timeout time.Duration) error {
	url := "http://" + httpAddress + path
	client := &http.Client{Timeout: timeout}
	if httpAddress == "" {
		sock := driver.StatusSocket(stateDir)
		url = "http://converge" + path
		client.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("asking the plugin (is it running with this state directory?): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("the plugin answered %s for %s: %s", resp.Status, path, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}

// PrintStatus writes each storage pool's space, then the volumes as a
// table (volume, pool, phase, provisioning, staged at, publishes
// fulfilled/desired, size, condition or last error, next retry), or all
// of it as JSON.
func PrintStatus(w io.Writer, s Status, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	if len(s.Pools) > 0 {
		fmt.Fprintf(w, "NODE            %s: every volume below lives on this node's disk\n", s.Pools[0].Node)
	}
	for _, p := range s.Pools {
		printPool(w, p)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tPOOL\tPHASE\tPROV\tSTAGED AT\tPUBLISHES\tSIZE\tPROBLEM\tNEXT RETRY")
	for _, v := range s.Volumes {
		stagedAt := v.StagingPath
		if stagedAt == "" {
			stagedAt = "-"
		} else if !v.StageReady {
			stagedAt += " (not yet)"
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
		prov := v.Provisioning
		if prov == "" {
			prov = "-"
		}
		pool := v.Pool
		if pool == "" {
			pool = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", v.ID, pool, v.Phase, prov, stagedAt, v.PublishesActual, v.PublishesDesired,
			size(v.SizeBytes), strings.ReplaceAll(problem, "\n", " "), retry)
	}
	return tw.Flush()
}

// unreadable returns an error naming the pools whose space could not be
// read, nil when there are none.
func unreadable(pools []volstatus.PoolStatus) error {
	var names []string
	for _, p := range pools {
		if p.Error != "" {
			names = append(names, p.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("cannot read storage pool(s) %s: see their POOL lines (or \"error\" in -o json)", strings.Join(names, ", "))
}

// printPool writes one storage pool's space: a POOL line, then what it
// promised, can still promise, its snapshots and its restores, indented.
func printPool(w io.Writer, p volstatus.PoolStatus) {
	if p.Error != "" {
		fmt.Fprintf(w, "%-16s%s: UNREADABLE: %s\n", "POOL "+p.Name, p.Dir, p.Error)
		return
	}
	guard := ""
	if p.KubeletFilesystem {
		guard = ", on the kubelet's filesystem"
	}
	if p.GuardBelowKubeletEviction {
		guard += fmt.Sprintf(" GUARD BELOW THE KUBELET'S EVICTION THRESHOLD (%d%%): its volumes may make the kubelet evict pods", driver.KubeletEvictionPercent)
	}
	if p.NearlyFull {
		guard += " NEARLY FULL: no volume is created or grown"
	}
	holes := "punches holes"
	if !p.PunchesHoles {
		holes = "punches no holes: thin volumes never give space back"
	}
	fmt.Fprintf(w, "%-16s%s: size %s, free %s (guard %s), %s, %s%s\n", "POOL "+p.Name, p.Dir, amount(p.SizeBytes), amount(p.FreeBytes), amount(p.GuardBytes),
		p.FsType, holes, guard)
	fmt.Fprintf(w, "  PROMISED      thick %s (%s not yet allocated), thin %s (%s written and not shared, ratio %g)\n",
		amount(p.ThickPromisedBytes), amount(p.ThickOwedBytes), amount(p.ThinPromisedBytes), amount(p.ThinAllocatedBytes), p.OverprovisioningRatio)
	fmt.Fprintf(w, "  AVAILABLE     thick %s, thin %s\n", amount(p.ThickAvailableBytes), amount(p.ThinAvailableBytes))
	fmt.Fprintf(w, "  SNAPSHOTS     %d, allocating %s (copied by %s), %s promised to those being taken\n", p.Snapshots, amount(p.SnapshotBytes), p.CopyMode, amount(p.CopyingBytes))
	for _, r := range p.Restores {
		fmt.Fprintf(w, "  RESTORING     %s from snapshot %s: %s of its %s copied, %s promised until it is made\n",
			r.VolumeID, r.SnapshotID, amount(r.CopiedBytes), amount(r.SourceBytes), amount(r.SizeBytes))
	}
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

// amount is size, with 0 shown as such.
func amount(b int64) string {
	if b == 0 {
		return "0"
	}
	return size(b)
}
