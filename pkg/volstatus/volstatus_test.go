package volstatus

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestVolumeStatusJSONNames checks the JSON names of a volume's status,
// which csi-node status prints and operators' scripts read: a Go field
// renamed (Staged became StageReady) must keep its published name.
func TestVolumeStatusJSONNames(t *testing.T) {
	want := []string{"access", "attempts", "id", "ioLimitsApplied", "ioLimitsDesired", "lastError", "message", "nextRetry", "phase", "pool", "provisioning",
		"publishesActual", "publishesDesired", "reason", "sizeBytes", "staged", "stagingPath"}
	var s VolumeStatus
	// Every field set, so that omitempty leaves none out.
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		case reflect.Pointer:
			if f.Type() != reflect.TypeFor[*IOLimits]() {
				t.Fatalf("field %s of type %s: the test does not know how to set it", v.Type().Field(i).Name, f.Type())
			}
			f.Set(reflect.ValueOf(&IOLimits{ReadIOPS: 1, WriteIOPS: 1, ReadBPS: 1, WriteBPS: 1}))
		default:
			if f.Type() != reflect.TypeFor[time.Time]() {
				t.Fatalf("field %s of kind %s: the test does not know how to set it", v.Type().Field(i).Name, f.Kind())
			}
			f.Set(reflect.ValueOf(time.Unix(1, 0)))
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("JSON names of VolumeStatus: got %v, want %v", got, want)
	}
	var limits []string
	for k := range m["ioLimitsDesired"].(map[string]any) {
		limits = append(limits, k)
	}
	slices.Sort(limits)
	if want := []string{"readBPS", "readIOPS", "writeBPS", "writeIOPS"}; !slices.Equal(limits, want) {
		t.Errorf("JSON names of IOLimits: got %v, want %v", limits, want)
	}
}
