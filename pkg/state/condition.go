package state

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
