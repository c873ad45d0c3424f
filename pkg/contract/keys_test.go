package contract

import "testing"

// TestCheckKeys owns the refusal of keys converge does not know, for
// StorageClass and VolumeSnapshotClass parameters and volume attributes
// alike: Kubernetes' own keys pass, every other unknown key is named (the
// callers answer INVALID_ARGUMENT).
func TestCheckKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    map[string]string
		want string
	}{
		{name: "none", m: nil},
		{name: "known", m: map[string]string{MkfsOptionsKey: "-b 4096"}},
		{name: "kubernetes' own", m: map[string]string{"csi.storage.k8s.io/pvc/name": "c", "storage.kubernetes.io/csiProvisionerIdentity": "x"}},
		{name: "unknown, named in order", m: map[string]string{"b": "", "a": "", MkfsOptionsKey: ""}, want: `unknown parameters: "a", "b"`},
		{name: "a prefix alike is not kubernetes'", m: map[string]string{"csi.storage.k8s.io": ""}, want: `unknown parameters: "csi.storage.k8s.io"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckKeys("parameters", tc.m, MkfsOptionsKey)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want none", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}
