package state

import (
	"reflect"
	"slices"
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/locks"
)

// reports are what the store answers from memory, never durable: the
// result of the latest attempt on each intent, the terminalFailures (terminal
// failures), each volume's condition, and the channels of those waiting
// for a change. After a restart the kubelet's retries find them again. Its
// lock is a leaf: nothing else is locked while it is held.
type reports struct {
	// mu guards everything below.
	mu               locks.Mutex
	results          map[string]map[IntentKey]Result
	terminalFailures map[string]map[IntentKey]TerminalFailure
	conditions       map[string]Condition
	watchers         map[string]chan struct{}
	// live holds the IDs that have a record: a volume without one has no
	// condition.
	live map[string]bool
}

func newReports() reports {
	return reports{
		results:          map[string]map[IntentKey]Result{},
		terminalFailures: map[string]map[IntentKey]TerminalFailure{},
		conditions:       map[string]Condition{},
		watchers:         map[string]chan struct{}{},
		live:             map[string]bool{},
	}
}

// SetResult records the result of the latest attempt on one intent and wakes
// the volume's waiters. Results live in memory only: after a restart the
// kubelet's retries find the result again.
func (s *reports) SetResult(id string, key IntentKey, r Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setResultLocked(id, key, r) {
		s.notifyLocked(id)
	}
}

// setResultLocked records r and reports whether it changed anything.
func (s *reports) setResultLocked(id string, key IntentKey, r Result) bool {
	m := s.results[id]
	if m == nil {
		m = map[IntentKey]Result{}
		s.results[id] = m
	}
	if old, ok := m[key]; ok && reflect.DeepEqual(old, r) {
		return false
	}
	m[key] = r
	return true
}

// Result returns the latest result of one intent; ok is false when there
// is none.
func (s *reports) Result(id string, key IntentKey) (r Result, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok = s.results[id][key]
	return r, ok
}

// pruneResultsLocked drops the results of intents that v no longer holds.
func (s *reports) pruneResultsLocked(v *Volume) {
	for k := range s.results[v.ID] {
		if k == StageKey && v.Stage != nil || k == ExpandKey && v.Expand != nil || k == IOLimitsKey && v.IOLimits != nil {
			continue
		}
		if target, ok := strings.CutPrefix(string(k), "publish:"); ok && v.Publishes[target] != nil {
			continue
		}
		if id, ok := strings.CutPrefix(string(k), "snapshot:"); ok && v.Snapshots[id] != nil {
			continue
		}
		delete(s.results[v.ID], k)
	}
	if len(s.results[v.ID]) == 0 {
		delete(s.results, v.ID)
	}
	if v.Empty() {
		delete(s.conditions, v.ID)
	}
}

// recorded brings the reports in line with v, just committed: the results
// of intents v no longer holds go, and v's waiters wake.
func (s *reports) recorded(v *Volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.Empty() {
		delete(s.live, v.ID)
	} else {
		s.live[v.ID] = true
	}
	s.pruneResultsLocked(v)
	s.notifyLocked(v.ID)
}

// SetTerminalFailure records a terminal failure of one intent generation and wakes the
// volume's waiters. Only the latest final of each intent is kept.
func (s *reports) SetTerminalFailure(id string, key IntentKey, f TerminalFailure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.terminalFailures[id]
	if m == nil {
		m = map[IntentKey]TerminalFailure{}
		s.terminalFailures[id] = m
	}
	m[key] = f
	s.notifyLocked(id)
}

// TerminalFailureFor returns the terminal failure of generation gen of one intent, or
// nil when that generation did not fail terminally.
func (s *reports) TerminalFailureFor(id string, key IntentKey, gen int64) *classified.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.terminalFailures[id][key]; ok && f.Generation == gen {
		return f.Err
	}
	return nil
}

// LastTerminalFailure returns the latest terminal failure of one intent of id,
// whatever its generation; ok is false when there is none.
func (s *reports) LastTerminalFailure(id string, key IntentKey) (f TerminalFailure, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok = s.terminalFailures[id][key]
	return f, ok
}

// DropTerminalFailures forgets the terminal failures of id, e.g. when the volume is
// deleted.
func (s *reports) DropTerminalFailures(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.terminalFailures, id)
}

// Watch returns a channel that is closed at the next change of the record
// or of a result of id. Take the channel before reading the state it guards.
func (s *reports) Watch(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.watchers[id]
	if !ok {
		ch = make(chan struct{})
		s.watchers[id] = ch
	}
	return ch
}

func (s *reports) notifyLocked(id string) {
	if ch, ok := s.watchers[id]; ok {
		close(ch)
		delete(s.watchers, id)
	}
}

// SetCondition records the health of a volume, in memory only. A volume
// without a record has no condition.
func (s *reports) SetCondition(id string, c Condition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setConditionLocked(id, c)
}

func (s *reports) setConditionLocked(id string, c Condition) {
	if !s.live[id] || !c.Abnormal && len(c.Unusable) == 0 {
		delete(s.conditions, id)
		return
	}
	s.conditions[id] = c
}

// Fulfilled records that intent key of volume id was fulfilled at
// generation gen by an operation that just succeeded, before a pass has
// observed its work: the result is ready, and path, where the volume now
// is, leaves the condition's unusable paths. The next pass confirms both.
func (s *reports) Fulfilled(id string, key IntentKey, gen int64, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setResultLocked(id, key, Result{Generation: gen, Ready: true})
	if c, ok := s.conditions[id]; ok {
		c.Unusable = slices.DeleteFunc(slices.Clone(c.Unusable), func(p string) bool { return p == path })
		s.setConditionLocked(id, c)
	}
	s.notifyLocked(id)
}

// Condition returns the health of a volume; the zero Condition (normal)
// when the reconciler reported nothing wrong or has not looked yet.
func (s *reports) Condition(id string) Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.conditions[id]
	c.Unusable = append([]string(nil), c.Unusable...)
	return c
}
