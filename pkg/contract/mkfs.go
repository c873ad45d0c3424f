package contract

import (
	"fmt"
	"slices"
	"strings"

	"github.com/converge-csi/converge/pkg/host"
)

// mkfsPolicy lists, per filesystem, the mkfs flags a StorageClass may set.
// Each takes one value. Nothing that names a device, a file or a journal
// elsewhere is allowed, and nothing that forces anything.
var mkfsPolicy = map[string]map[string]bool{
	host.FsExt4:  {"-b": true, "-i": true, "-I": true, "-m": true, "-N": true, "-E": true, "-O": true, "-L": true},
	host.FsXFS:   {"-b": true, "-i": true, "-m": true, "-n": true, "-d": true, "-L": true},
	host.FsBtrfs: {"-n": true, "-s": true, "-m": true, "-d": true, "-O": true, "-L": true},
}

// maxMkfsOptions bounds the options of one volume.
const maxMkfsOptions = 32

// CheckMkfsOptions parses the value of MkfsOptionsKey for fsType ("" is
// ext4) into mkfs arguments, or says which option it refuses. Values may
// hold letters, digits and "_^=,.:-" only.
func CheckMkfsOptions(fsType, value string) ([]string, error) {
	if fsType == "" {
		fsType = host.DefaultFsType
	}
	allowed, ok := mkfsPolicy[fsType]
	if !ok {
		return nil, fmt.Errorf("no mkfs options are allowed for fs type %q", fsType)
	}
	fields := strings.Fields(value)
	if len(fields) > 2*maxMkfsOptions {
		return nil, fmt.Errorf("%s: at most %d options", MkfsOptionsKey, maxMkfsOptions)
	}
	if len(fields)%2 != 0 {
		return nil, fmt.Errorf("%s: %q: every option takes one value", MkfsOptionsKey, value)
	}
	for i := 0; i < len(fields); i += 2 {
		flag, arg := fields[i], fields[i+1]
		if !allowed[flag] {
			return nil, fmt.Errorf("%s: mkfs option %q is not allowed for %s", MkfsOptionsKey, flag, fsType)
		}
		for _, c := range arg {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_^=,.:-", c)) {
				return nil, fmt.Errorf("%s: value %q of %s holds %q", MkfsOptionsKey, arg, flag, c)
			}
		}
		if arg[0] == '-' {
			return nil, fmt.Errorf("%s: value %q of %s looks like an option", MkfsOptionsKey, arg, flag)
		}
		if flag == "-E" && slices.ContainsFunc(strings.Split(arg, ","), func(o string) bool {
			name, _, _ := strings.Cut(o, "=")
			return name == host.Mke2fsPrezeroed
		}) {
			// A claim about the device that only the plugin can check: a
			// filesystem made on a device that does not read zeros where
			// mke2fs trusts it to would be taken apart by a later fsck.
			return nil, fmt.Errorf("%s: %s is set by the plugin, which knows whether a new volume's image holds only zeros", MkfsOptionsKey, host.Mke2fsPrezeroed)
		}
	}
	return fields, nil
}
