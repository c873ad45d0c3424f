package contract

import (
	"slices"
	"strings"
	"testing"
)

func TestMkfsOptionsPolicy(t *testing.T) {
	tests := []struct {
		fs, value string
		want      []string // nil: refused
	}{
		{fs: "", value: "", want: []string{}},
		{fs: "ext4", value: "-b 4096 -i 8192", want: []string{"-b", "4096", "-i", "8192"}},
		{fs: "ext4", value: "-E lazy_itable_init=0,lazy_journal_init=0", want: []string{"-E", "lazy_itable_init=0,lazy_journal_init=0"}},
		{fs: "ext4", value: "-O ^has_journal", want: []string{"-O", "^has_journal"}},
		{fs: "ext4", value: "-E assume_storage_prezeroed=1"},                 // the plugin's claim to make
		{fs: "ext4", value: "-E nodiscard,assume_storage_prezeroed -b 4096"}, // the same, without a value
		{fs: "ext4", value: "-E assume_storage_prezeroed=0"},                 // ... or saying no
		{fs: "xfs", value: "-m reflink=1 -i size=512", want: []string{"-m", "reflink=1", "-i", "size=512"}},
		{fs: "btrfs", value: "-n 16384", want: []string{"-n", "16384"}},
		{fs: "ext4", value: "-J device=/dev/sda"}, // journal on another device
		{fs: "ext4", value: "-b"},                        // no value
		{fs: "ext4", value: "-F -b 4096"},                // force
		{fs: "ext4", value: "-b 4096;rm"},                // shell
		{fs: "ext4", value: "-L $(reboot)"},              // shell
		{fs: "ext4", value: "-E root_owner=0:0 -d /etc"}, // populate from a directory
		{fs: "ext4", value: "-b -F"},                     // option as a value
		{fs: "xfs", value: "-b 4096 -f x"},               // force
		{fs: "ntfs", value: "-b 4096"},
		{fs: "ext4", value: strings.Repeat("-b 1 ", 33)},
	}
	for _, tc := range tests {
		got, err := CheckMkfsOptions(tc.fs, tc.value)
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%s %q: accepted as %q, want refused", tc.fs, tc.value, got)
		case tc.want != nil && err != nil:
			t.Errorf("%s %q: %v, want %q", tc.fs, tc.value, err, tc.want)
		case tc.want != nil && len(tc.want) > 0 && !slices.Equal(got, tc.want):
			t.Errorf("%s %q: got %q, want %q", tc.fs, tc.value, got, tc.want)
		}
	}
}
