package contract

import (
	"fmt"
	"strings"

	"github.com/converge-csi/converge/pkg/classified"
)

// MaxIDLength is the longest volume or snapshot ID or name; CSI's limit
// for strings that serve as identifiers.
const MaxIDLength = 128

// ValidID checks that id may name a volume or snapshot: 1 to MaxIDLength
// bytes of [A-Za-z0-9._-], not starting with a dot (so never "." or ".."
// and never a hidden file in a data directory). Every ID converge makes
// or records is one it accepts.
func ValidID(id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("volume ID must be 1 to %d bytes long, got %d", MaxIDLength, len(id))
	}
	if id[0] == '.' {
		return fmt.Errorf("volume ID %q must not start with a dot", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("volume ID %q may only hold letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// IDUse is what a request does with the ID it names, which decides how it
// answers an ID that ValidID refuses (CheckID).
type IDUse int

const (
	// Records: the request makes something under the ID or writes the
	// kubelet's intent for it into the volume's record: CreateVolume's and
	// CreateSnapshot's names, NodeStageVolume, NodePublishVolume,
	// NodeUnpublishVolume and NodeUnstageVolume. No file, record or intent
	// may ever carry an invalid ID: INVALID_ARGUMENT.
	Records IDUse = iota
	// Finds: the request is about a volume or snapshot that must already
	// be there, and answers NOT_FOUND for a valid ID that names none (CSI:
	// "volume does not exist"), or OK for a delete: ControllerExpandVolume
	// and NodeExpandVolume, ValidateVolumeCapabilities, DeleteVolume,
	// DeleteSnapshot, the source of a snapshot, clone or restore,
	// NodeGetVolumeStats and NodeGetVolumeHealth. An invalid ID is answered
	// as a valid one with nothing under it, NOT_FOUND, since nothing can
	// ever have been made under it (csi-sanity's DeleteVolume with an
	// invalid ID wants OK).
	Finds
)

// CheckID is the one rule for IDs: what (e.g. "volume", "source
// snapshot") names the ID a request carries, and use says what the
// request does with it. No ID at all is INVALID_ARGUMENT ("<what> ID is
// required"); an ID ValidID refuses is INVALID_ARGUMENT with ValidID's
// reason for a request that Records it, NOT_FOUND ("<what> <id> not
// found") for one that Finds. A valid ID is nil. CreateVolume and
// CreateSnapshot apply ValidID to their names themselves, to say which
// name, and answer INVALID_ARGUMENT as Records does.
func CheckID(what, id string, use IDUse) error {
	if id == "" {
		return classified.Errorf(classified.KindInvalidArgument, "%s ID is required", what)
	}
	err := ValidID(id)
	switch {
	case err == nil:
		return nil
	case use == Finds:
		return classified.Errorf(classified.KindNotFound, "%s %s not found", what, id)
	default:
		return classified.Errorf(classified.KindInvalidArgument, "%v", err)
	}
}

// NodeSep separates a volume's or a snapshot's name from the name of the
// node it lives on in its ID (<name>_<node>): Kubernetes node names (DNS
// subdomains) never hold it, so the node is what follows the last one.
const NodeSep = "_"

// NodeOfID returns the node an ID names: the text after its last NodeSep,
// "" when it holds none. The node side makes every snapshot and group
// snapshot ID this way, and converge-controller reads a snapshot's node
// from its handle by this rule alone. A volume made before volume IDs
// named their node has its name as its ID, which may hold the separator
// too: what this returns for a volume ID is a node only if that node has
// the volume.
func NodeOfID(id string) string {
	i := strings.LastIndex(id, NodeSep)
	if i < 0 {
		return ""
	}
	return id[i+1:]
}
