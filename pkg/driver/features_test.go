package driver

import (
	"flag"
	"strings"
	"testing"
)

func TestFeatureGatesFlag(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    string // String() after parsing
		wantErr string
	}{
		{name: "none", args: nil, want: ""},
		{name: "one", args: []string{"--feature-gates=VolumeHealth=true"}, want: "VolumeHealth=true"},
		{name: "several, spaces", args: []string{"--feature-gates= VolumeCondition=true , SnapshotAccessibility=false"}, want: "SnapshotAccessibility=false,VolumeCondition=true"},
		{name: "repeated adds", args: []string{"--feature-gates=VolumeHealth=true", "--feature-gates=VolumeHealth=false,VolumeCondition=1"}, want: "VolumeCondition=true,VolumeHealth=false"},
		{name: "unknown", args: []string{"--feature-gates=Topology=true"}, wantErr: `unknown feature "Topology" (known: ModifyVolume, SnapshotAccessibility, VolumeCondition, VolumeHealth)`},
		{name: "not a pair", args: []string{"--feature-gates=VolumeHealth"}, wantErr: `"VolumeHealth" is not Name=true`},
		{name: "not a boolean", args: []string{"--feature-gates=VolumeHealth=yes"}, wantErr: `feature VolumeHealth: "yes" is not a boolean`},
		{name: "case matters", args: []string{"--feature-gates=volumehealth=true"}, wantErr: "unknown feature"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var g FeatureGates
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(new(strings.Builder))
			fs.Var(&g, "feature-gates", "")
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if len(g) != 0 {
					t.Errorf("a refused value set %v, want nothing", g)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.String() != tc.want {
				t.Errorf("got %q, want %q", g.String(), tc.want)
			}
		})
	}
	var g FeatureGates
	if g.Enabled(VolumeHealth) {
		t.Error("the zero FeatureGates has VolumeHealth on")
	}
	// ModifyVolume is on unless turned off: csi-provisioner provisions no
	// claim of a VolumeAttributesClass for a driver without it.
	if !g.Enabled(ModifyVolume) {
		t.Error("the zero FeatureGates has ModifyVolume off")
	}
	if err := g.Set("ModifyVolume=false"); err != nil || g.Enabled(ModifyVolume) {
		t.Errorf("ModifyVolume=false: %v, on %v", err, g.Enabled(ModifyVolume))
	}
}
