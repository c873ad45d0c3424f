package e2e

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// call is one CSI call csi-node answered, as its log (at -v 4) records it.
type call struct {
	method string // e.g. NodeStageVolume
	volume string
	code   string // OK, or the gRPC code
	msg    string // the error's message, "" for OK
	// end is when the answer was logged (the container log's time, zero
	// in a log without it), took the call's duration as csi-node logs it.
	end  time.Time
	took time.Duration
}

// start is when the call began, by its end and its duration.
func (c call) start() time.Time { return c.end.Add(-c.took) }

func (c call) String() string { return fmt.Sprintf("%s(%s) = %s", c.method, c.volume, c.code) }

var (
	callLine = regexp.MustCompile(`"Call (succeeded|failed)".*method="/csi\.v1\.[A-Za-z]+/([A-Za-z]+)"`)
	// A CreateVolume names the volume it makes by its name.
	volumeAttr = regexp.MustCompile(`(?:volumeID|volumeName)="([^"]+)"`)
	codeAttr   = regexp.MustCompile(`code="([^"]+)"`)
	msgAttr    = regexp.MustCompile(`message="((?:[^"\\]|\\.)*)"`)
	tookAttr   = regexp.MustCompile(`duration="([^"]+)"`)
)

// readCalls parses csi-node's logs, oldest first, for the calls made about
// volume (all volumes when it is empty), in order. Each line may carry the
// prefix of the kubelet's container logs (time, stream, tag).
func readCalls(logs []string, volume string) ([]call, error) {
	var out []call
	for _, log := range logs {
		calls, err := readCallsOf(log, volume)
		if err != nil {
			return nil, err
		}
		out = append(out, calls...)
	}
	return out, nil
}

func readCallsOf(log, volume string) ([]call, error) {
	f, err := os.Open(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []call
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := callLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		c := call{method: m[2], code: "OK"}
		if v := volumeAttr.FindStringSubmatch(sc.Text()); v != nil {
			c.volume = v[1]
		}
		if m[1] == "failed" {
			c.code = "?"
			if v := codeAttr.FindStringSubmatch(sc.Text()); v != nil {
				c.code = v[1]
			}
			if v := msgAttr.FindStringSubmatch(sc.Text()); v != nil {
				c.msg = v[1]
			}
		}
		if t, err := time.Parse(time.RFC3339Nano, strings.SplitN(sc.Text(), " ", 2)[0]); err == nil {
			c.end = t
		}
		if v := tookAttr.FindStringSubmatch(sc.Text()); v != nil {
			c.took, _ = time.ParseDuration(v[1])
		}
		if volume == "" || c.volume == volume {
			out = append(out, c)
		}
	}
	return out, sc.Err()
}

// count is how many of calls are method with code.
func count(calls []call, method, code string) int {
	n := 0
	for _, c := range calls {
		if c.method == method && c.code == code {
			n++
		}
	}
	return n
}

func describe(calls []call) string {
	var b strings.Builder
	for _, c := range calls {
		if strings.HasPrefix(c.method, "Node") && c.method != "NodeGetVolumeStats" && c.method != "NodeGetCapabilities" {
			fmt.Fprintf(&b, "\n    %s", c)
		}
	}
	return b.String()
}
