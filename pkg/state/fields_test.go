package state

import (
	"reflect"
	"testing"
	"time"
)

// The record's methods that list its fields by hand (SameSpec, DeepCopy,
// FinishRemoval, Empty) must learn of every field added to it. These tests
// read the fields by reflection, so a new field fails them until it is
// handled, and its place in each list is decided here.

// fill sets every exported field reachable from v to a value that is not
// zero: each slice and map gets one element, each pointer a value.
func fill(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(t, p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(t, s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k)
		fill(t, e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i))
			}
		}
	default:
		t.Fatalf("fill: a field of kind %s: teach fill to set it", v.Kind())
	}
}

// filled returns a volume record with every field set.
func filled(t *testing.T) *Volume {
	v := &Volume{}
	fill(t, reflect.ValueOf(v).Elem())
	return v
}

// shared lists the places, under path, where a and b (equal values) share
// memory: the same pointer, the same map or the same backing array.
func shared(path string, a, b reflect.Value) []string {
	var out []string
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return nil
		}
		if a.Pointer() == b.Pointer() {
			out = append(out, path)
		}
		out = append(out, shared(path, a.Elem(), b.Elem())...)
	case reflect.Slice:
		if a.Len() > 0 && a.Pointer() == b.Pointer() {
			out = append(out, path)
		}
		for i := range a.Len() {
			out = append(out, shared(path+"[]", a.Index(i), b.Index(i))...)
		}
	case reflect.Map:
		if a.IsNil() {
			return nil
		}
		if a.Pointer() == b.Pointer() {
			out = append(out, path)
		}
		for _, k := range a.MapKeys() {
			out = append(out, shared(path+"[]", a.MapIndex(k), b.MapIndex(k))...)
		}
	case reflect.Struct:
		for i := range a.NumField() {
			if f := a.Type().Field(i); f.IsExported() {
				out = append(out, shared(path+"."+f.Name, a.Field(i), b.Field(i))...)
			}
		}
	}
	return out
}

// TestDeepCopyCopiesEveryField checks that DeepCopy of a record with every
// field set equals it and shares no memory with it: a slice, map or
// pointer field added to the record and not cloned fails here.
func TestDeepCopyCopiesEveryField(t *testing.T) {
	v := filled(t)
	c := v.DeepCopy()
	if !reflect.DeepEqual(v, c) {
		t.Errorf("got %+v, want %+v", c, v)
	}
	for _, p := range shared("Volume", reflect.ValueOf(v), reflect.ValueOf(c)) {
		t.Errorf("DeepCopy shares %s with the original: clone it in DeepCopy", p)
	}
}

// checkFields fails for every field of typ missing from table, and for
// every entry of table that names no field.
func checkFields(t *testing.T, typ reflect.Type, table map[string]bool, list string) {
	t.Helper()
	for i := range typ.NumField() {
		if _, ok := table[typ.Field(i).Name]; !ok {
			t.Errorf("field %s.%s is missing from %s: handle it there, and say here how", typ.Name(), typ.Field(i).Name, list)
		}
	}
	for name := range table {
		if _, ok := typ.FieldByName(name); !ok {
			t.Errorf("%s names %s.%s, which is no field", list, typ.Name(), name)
		}
	}
}

// TestSameSpecComparesEveryField checks, for each field of a stage and of
// a publish, that SameSpec compares it when it is part of what the
// kubelet asked for (true) and ignores it when the plugin or the store
// keeps it (false): an intent whose spec changed gets a new generation
// (stampGenerations), and a request that differs only in an ignored field
// is a duplicate.
func TestSameSpecComparesEveryField(t *testing.T) {
	stage := map[string]bool{
		"Path": true, "Access": true, "FsType": true, "MountFlags": true, "MkfsOptions": true,
		"Device": true, "AccessMode": true, "ReadOnly": true,
		"MountID": false, "SpaceRanOutUnder": false, "SpaceRanOutAt": false, "Generation": false, "Deleting": false,
	}
	publish := map[string]bool{
		"Access": true, "AccessMode": true, "ReadOnly": true, "MountFlags": true,
		"MountID": false, "Generation": false, "Deleting": false,
	}
	checkFields(t, reflect.TypeFor[Stage](), stage, "Stage.SameSpec")
	checkFields(t, reflect.TypeFor[Publish](), publish, "Publish.SameSpec")
	for name, compared := range stage {
		a, b := filled(t).Stage, filled(t).Stage
		reflect.ValueOf(b).Elem().FieldByName(name).SetZero()
		if got := a.SameSpec(b); got == compared {
			t.Errorf("Stage.SameSpec of stages that differ in %s only: got %v, want %v", name, got, !compared)
		}
	}
	for name, compared := range publish {
		a, b := filled(t).Publishes["x"], filled(t).Publishes["x"]
		reflect.ValueOf(b).Elem().FieldByName(name).SetZero()
		if got := a.SameSpec(b); got == compared {
			t.Errorf("Publish.SameSpec of publishes that differ in %s only: got %v, want %v", name, got, !compared)
		}
	}
}

// TestRemovalAndEmptyListEveryField checks, for each field of the record,
// whether FinishRemoval keeps it (true: an intent or a marker that still
// describes the machine) or forgets it (false: what described the removed
// image), and whether a record holding that field alone is worth keeping
// (Empty is false).
func TestRemovalAndEmptyListEveryField(t *testing.T) {
	keeps := map[string]bool{
		"ID": true, "Generation": true, "Stage": true, "Publishes": true, "Expand": true, "Snapshots": true, "Frozen": true,
		"Formatted": false, "Removing": false, "DeviceID": false, "FsSize": false, "Provisioning": false,
		"Name": false, "Pool": false, "Changed": false, "Access": false, "IOLimits": false,
	}
	worthKeeping := map[string]bool{
		"Stage": true, "Publishes": true, "Formatted": true, "Removing": true, "Provisioning": true,
		"Name": true, "Pool": true, "Snapshots": true, "Frozen": true, "IOLimits": true,
		"ID": false, "Generation": false, "Expand": false, "DeviceID": false, "FsSize": false, "Changed": false, "Access": false,
	}
	typ := reflect.TypeFor[Volume]()
	checkFields(t, typ, keeps, "Volume.FinishRemoval")
	checkFields(t, typ, worthKeeping, "Volume.Empty")

	v, want := filled(t), filled(t)
	v.FinishRemoval()
	for name, kept := range keeps {
		got := reflect.ValueOf(v).Elem().FieldByName(name)
		switch {
		case kept && !reflect.DeepEqual(got.Interface(), reflect.ValueOf(want).Elem().FieldByName(name).Interface()):
			t.Errorf("FinishRemoval changed %s: got %v", name, got)
		case !kept && !got.IsZero():
			t.Errorf("FinishRemoval kept %s: got %v, want it forgotten", name, got)
		}
	}
	for name, worth := range worthKeeping {
		v := &Volume{}
		fill(t, reflect.ValueOf(v).Elem().FieldByName(name))
		if got := v.Empty(); got == worth {
			t.Errorf("Empty of a record holding %s alone: got %v, want %v", name, got, !worth)
		}
	}
}
