package state

import "slices"

// Health classifies an abnormal volume, after CSI's VolumeHealthErrorType.
type Health string

const (
	// Degraded: the volume works, but not as asked (e.g. read-only after
	// filesystem errors).
	Degraded Health = "DEGRADED"
	// Inaccessible: the volume cannot be used at one of its paths until the
	// reconciler repairs it.
	Inaccessible Health = "INACCESSIBLE"
	// DataLost: the data the volume held is known gone.
	DataLost Health = "DATA_LOSS"
)

// Condition is the health of a volume as the reconciler last saw it.
type Condition struct {
	// Abnormal is true when the volume is not what its intents ask for and
	// the reconciler has not (yet) repaired it.
	Abnormal bool
	// Health says how bad it is; empty when not abnormal.
	Health Health
	// Reason is a short CamelCase cause, e.g. StagingMountMissing.
	Reason string
	// Message says what is wrong and what the plugin does about it.
	Message string
	// Unusable lists the staging and target paths where the volume cannot
	// be used or measured: they hold no mount of its filesystem (usage read
	// there would be another filesystem's), or a broken one.
	Unusable []string
}

// SetCondition records the health of a volume, in memory only. A volume
// without a record has no condition.
func (s *Store) SetCondition(id string, c Condition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setConditionLocked(id, c)
}

func (s *Store) setConditionLocked(id string, c Condition) {
	if _, ok := s.volumes[id]; !ok || !c.Abnormal && len(c.Unusable) == 0 {
		delete(s.conditions, id)
		return
	}
	s.conditions[id] = c
}

// Fulfilled records that intent key of volume id was fulfilled at
// generation gen by an operation that just succeeded, before a pass has
// observed its work: the result is ready, and path, where the volume now
// is, leaves the condition's unusable paths. The next pass confirms both.
func (s *Store) Fulfilled(id string, key IntentKey, gen int64, path string) {
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
func (s *Store) Condition(id string) Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.conditions[id]
	c.Unusable = append([]string(nil), c.Unusable...)
	return c
}
