package classagent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
)

// calls records the hands the node took; fail makes the next ones fail.
type calls struct {
	mu       sync.Mutex
	got      []Hand
	fail     int
	attempts int
}

func (c *calls) modify(_ context.Context, h Hand) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if c.fail > 0 {
		c.fail--
		return errors.New("csi-node refused")
	}
	c.got = append(c.got, h)
	return nil
}

// waitFor waits until a hand of class reached the node, and returns how
// many attempts there were by then.
func (c *calls) waitFor(t *testing.T, class string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		n := len(c.got)
		last := Hand{}
		if n > 0 {
			last = c.got[n-1]
		}
		c.mu.Unlock()
		if last.Class == class {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.attempts
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Fatalf("class %s never handed; hands: %+v", class, c.got)
	return 0
}

func TestAgentHandsTheClassTheClaimNames(t *testing.T) {
	pv, claim, slow := world()
	fast := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, DriverName: driver,
		Parameters: map[string]string{"maxReadIops": "200"}}
	client := fake.NewClientset(pv, claim, slow, fast)
	c := &calls{fail: 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour}).Run(ctx)
	}()
	// At start-up, retried after the node's refusal.
	if n := c.waitFor(t, "slow"); n != 2 {
		t.Errorf("%d hands before slow went through, want the refused one and its retry", n)
	}

	// The claim's owner switches to fast: handed at once, whatever the
	// PV says.
	claim.Spec.VolumeAttributesClassName = ptr.To("fast")
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "fast")
	c.mu.Lock()
	last := c.got[len(c.got)-1]
	c.mu.Unlock()
	if last.VolumeID != "pvc-1_b" || last.Params["maxReadIops"] != "200" {
		t.Errorf("handed %+v", last)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestAgentTellsTheClaimOfARefusal: a class the volume's node keeps
// refusing is told in one Warning event on the claim, and retried.
func TestAgentTellsTheClaimOfARefusal(t *testing.T) {
	pv, claim, slow := world()
	client := fake.NewClientset(pv, claim, slow)
	c := &calls{fail: failTimes + 1}
	events := record.NewFakeRecorder(10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go New(Config{Client: client, Scope: scope, Modify: c.modify, Resync: time.Hour, Events: events, RetryBase: 10 * time.Millisecond}).Run(ctx)
	if n := c.waitFor(t, "slow"); n != failTimes+2 {
		t.Errorf("%d tries before slow went through, want %d", n, failTimes+2)
	}
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.Contains(got[0], "Warning "+ReasonNotApplied) || !strings.Contains(got[0], `class "slow"`) ||
		!strings.Contains(got[0], "csi-node refused") {
		t.Errorf("events: %q, want one %s quoting the refusal", got, ReasonNotApplied)
	}
}
