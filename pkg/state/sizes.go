package state

import "github.com/converge-csi/converge/pkg/classified"

// Range is a capacity range as CSI asks for one: at least Required bytes
// and at most Limit, each 0 when not given.
type Range struct {
	Required, Limit int64
}

// Check refuses a range with a negative bound (INVALID_ARGUMENT) or whose
// required size is over its limit (OUT_OF_RANGE).
func (r Range) Check() error {
	if r.Required < 0 || r.Limit < 0 {
		return classified.Errorf(classified.KindInvalidArgument, "capacity range must not be negative")
	}
	if r.Limit > 0 && r.Required > r.Limit {
		return classified.Errorf(classified.KindOutOfRange, "required bytes %d exceed limit bytes %d", r.Required, r.Limit)
	}
	return nil
}

// Grows refuses to bring volume id of have bytes into the range when it
// is over the limit already: volumes never shrink (OUT_OF_RANGE).
func (r Range) Grows(id string, have int64) error {
	if r.Limit > 0 && have > r.Limit {
		return classified.Errorf(classified.KindOutOfRange, "volume %s already holds %d bytes, more than the limit %d; volumes never shrink", id, have, r.Limit)
	}
	return nil
}
