package controller

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// modify calls ControllerModifyVolume of volume id with params.
func modify(t *testing.T, c *Controller, id string, params map[string]string) error {
	t.Helper()
	_, err := c.ControllerModifyVolume(t.Context(), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params})
	return err
}

// recorded returns the IO limits volume id's record asks for, and the
// record's generation.
func recorded(t *testing.T, store *state.Store, id string) (host.IOLimits, int64) {
	t.Helper()
	v, err := store.Get(id)
	if err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	return v.WantsIOLimits(), v.Generation
}

// TestControllerModifyVolume drives one volume of this node through a
// class's changes, each step on what the one before left: a key given
// sets its limit and an absent one changes nothing (CSI), "max" removes a
// limit, the same parameters again are OK and write nothing, and a
// refused change (an unknown key, a value the kernel would refuse beside
// a good one) records no part of itself.
func TestControllerModifyVolume(t *testing.T) {
	c, store, _ := newController(t)
	id := create(t, c, "v")
	for _, step := range []struct {
		name   string
		params map[string]string
		code   codes.Code
		// msg is a part of the error's message.
		msg  string
		want host.IOLimits
		// same: the record is not written (its generation stays).
		same bool
	}{
		{name: "first limits", params: map[string]string{contract.MaxReadIOPSKey: "100", contract.MaxWriteBPSKey: "100Mi"},
			want: host.IOLimits{ReadIOPS: 100, WriteBPS: 100 << 20}},
		{name: "a key given merges, absent ones stay", params: map[string]string{contract.MaxWriteIOPSKey: "50"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 50, WriteBPS: 100 << 20}},
		{name: "the same parameters again", params: map[string]string{contract.MaxWriteIOPSKey: "50"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "the whole class again", params: map[string]string{contract.MaxReadIOPSKey: "100", contract.MaxWriteIOPSKey: "50", contract.MaxWriteBPSKey: "104857600"},
			want: host.IOLimits{ReadIOPS: 100, WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "max removes one", params: map[string]string{contract.MaxReadIOPSKey: "max"},
			want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}},
		{name: "no parameters change nothing", params: nil,
			want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "kubernetes' metadata is ignored", params: map[string]string{"csi.storage.k8s.io/pvc/name": "c", "csi.storage.k8s.io/pv/name": "pv"},
			want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "an unknown key", params: map[string]string{"XXX_FakeKey": "XXX_FakeValue"}, code: codes.InvalidArgument, msg: "XXX_FakeKey",
			want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "a bad value beside a good one: nothing recorded", params: map[string]string{contract.MaxReadIOPSKey: "10", contract.MaxWriteIOPSKey: "1"},
			code: codes.InvalidArgument, msg: contract.MaxWriteIOPSKey, want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "an empty value", params: map[string]string{contract.MaxReadBPSKey: ""}, code: codes.InvalidArgument, msg: contract.MaxReadBPSKey,
			want: host.IOLimits{WriteIOPS: 50, WriteBPS: 100 << 20}, same: true},
		{name: "every limit removed", params: map[string]string{contract.MaxWriteIOPSKey: "max", contract.MaxWriteBPSKey: "max"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			_, before := recorded(t, store, id)
			err := modify(t, c, id, step.params)
			if got := rpcerr.Code(err); got != step.code || !strings.Contains(errString(err), step.msg) {
				t.Fatalf("got %v (%v), want %v with %q", got, err, step.code, step.msg)
			}
			got, gen := recorded(t, store, id)
			if got != step.want {
				t.Errorf("got limits %+v, want %+v", got, step.want)
			}
			if (gen == before) != step.same {
				t.Errorf("got generation %d after %d, want it kept: %v", gen, before, step.same)
			}
		})
	}
}

// errString is err's text, "" for none.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestControllerModifyVolumeOfNoVolumeHere checks the volumes this node
// cannot modify: no ID is INVALID_ARGUMENT; an ID no volume can have, a
// volume of this node that does not exist or is being deleted, NOT_FOUND;
// a volume another node's ID names, OK once its parameters are valid
// (INVALID_ARGUMENT is the same answer on every node): that node's agent
// applies the class from the PersistentVolume the resizer then writes.
// None of them leaves a record here.
func TestControllerModifyVolumeOfNoVolumeHere(t *testing.T) {
	c, store, _ := newController(t)
	deleting := create(t, c, "deleting")
	if _, err := store.Update(deleting, func(v *state.Volume) error { return v.StartRemoval() }); err != nil {
		t.Fatal(err)
	}
	good := map[string]string{contract.MaxReadIOPSKey: "100"}
	for _, tc := range []struct {
		name   string
		id     string
		params map[string]string
		code   codes.Code
		msg    []string
	}{
		{name: "no ID", id: "", params: good, code: codes.InvalidArgument, msg: []string{"volume ID is required"}},
		{name: "an ID no volume can have", id: "../v", params: good, code: codes.NotFound},
		{name: "none of this node's", id: "gone_node", params: good, code: codes.NotFound, msg: []string{"gone_node"}},
		{name: "an ID that names no node", id: "gone", params: good, code: codes.NotFound, msg: []string{"gone"}},
		{name: "being deleted", id: deleting, params: good, code: codes.NotFound, msg: []string{deleting}},
		{name: "another node's", id: "v_other", params: good, code: codes.OK},
		{name: "another node's, with an unknown key", id: "v_other", params: map[string]string{"XXX_FakeKey": "x"}, code: codes.InvalidArgument, msg: []string{"XXX_FakeKey"}},
		{name: "another node's, with a bad value", id: "v_other", params: map[string]string{contract.MaxReadBPSKey: "0"}, code: codes.InvalidArgument, msg: []string{contract.MaxReadBPSKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := modify(t, c, tc.id, tc.params)
			if got := rpcerr.Code(err); got != tc.code {
				t.Fatalf("got %v (%v), want %v", got, err, tc.code)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("got %q, want it to say %q", err, m)
				}
			}
			if tc.id == "" || tc.id == deleting {
				return
			}
			if _, err := store.Get(tc.id); !errors.Is(err, state.ErrNotFound) {
				t.Errorf("got a record of %s (%v), want none", tc.id, err)
			}
		})
	}
	if v, err := store.Get(deleting); err != nil || v.IOLimits != nil {
		t.Errorf("the record of a volume being deleted: got %+v (%v), want no limits", v, err)
	}
}

// TestModifiedLimitsSurviveARestart records limits through
// ControllerModifyVolume, opens the store again as a restarted plugin
// does, and finds them there, with the same generation.
func TestModifiedLimitsSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	c := newControllerOn(t, store, dir)
	id := create(t, c, "v")
	if err := modify(t, c, id, map[string]string{contract.MaxReadBPSKey: "50M", contract.MaxWriteIOPSKey: "300"}); err != nil {
		t.Fatal(err)
	}
	want, _ := store.Get(id)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	got, err := again.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if got.IOLimits == nil || *got.IOLimits != *want.IOLimits || got.WantsIOLimits() != (host.IOLimits{ReadBPS: 50e6, WriteIOPS: 300}) {
		t.Errorf("after a restart: got %+v, want %+v", got.IOLimits, want.IOLimits)
	}
	// The restarted controller merges into what it finds.
	c = newControllerOn(t, again, dir)
	if err := modify(t, c, id, map[string]string{contract.MaxReadIOPSKey: "70"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := recorded(t, again, id); got != (host.IOLimits{ReadIOPS: 70, ReadBPS: 50e6, WriteIOPS: 300}) {
		t.Errorf("merged after a restart: got %+v", got)
	}
}

// TestModifyVolumeFollowsItsOption advertises MODIFY_VOLUME and serves
// ControllerModifyVolume only with Options.ModifyVolume (the driver's
// ModifyVolume feature): off, the RPC is UNIMPLEMENTED, before anything
// is looked at.
func TestModifyVolumeFollowsItsOption(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			c, _, _ := newController(t)
			c.opts.ModifyVolume = on
			resp, err := c.ControllerGetCapabilities(t.Context(), &csi.ControllerGetCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, cp := range resp.GetCapabilities() {
				got = got || cp.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME
			}
			if got != on {
				t.Errorf("MODIFY_VOLUME advertised: got %v, want %v", got, on)
			}
			_, err = c.ControllerModifyVolume(t.Context(), &csi.ControllerModifyVolumeRequest{VolumeId: "missing"})
			if code, want := rpcerr.Code(err), map[bool]codes.Code{false: codes.Unimplemented, true: codes.NotFound}[on]; code != want {
				t.Errorf("ControllerModifyVolume of no volume: got %v, want %v", err, want)
			}
		})
	}
}

// newControllerOn is newController on store, its images in dir/volumes:
// what a plugin restarted on the same state directory serves.
func newControllerOn(t *testing.T, store *state.Store, dir string) *Controller {
	t.Helper()
	images := &devices.Images{Dir: filepath.Join(dir, "volumes")}
	if err := os.MkdirAll(images.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := pool.New(store, pool.Options{Dir: images.Dir, Ratio: 1, Guard: &capacity.Guard{Percent: 5}, CopyMode: devices.CopySparse})
	t.Cleanup(p.Close)
	return New(pool.NewPools(store, p), store, map[string]string{contract.TopologyKey: "node"}, Options{ModifyVolume: true})
}

// createLimited makes volume name with a class's mutable parameters and
// returns its ID.
func createLimited(t *testing.T, c *Controller, name string, mutable map[string]string) (string, error) {
	t.Helper()
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: capMount,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pool.MinVolumeSize}, MutableParameters: mutable})
	return resp.GetVolume().GetVolumeId(), err
}

// TestCreateVolumeRecordsIOLimits checks the class a claim is made with:
// its limits recorded with the volume (keys it does not give are no
// limits), a bad one refused before anything is made, and a repeated
// CreateVolume OK with the same limits and ALREADY_EXISTS with others (CSI
// counts the mutable parameters among what a volume must match).
func TestCreateVolumeRecordsIOLimits(t *testing.T) {
	c, store, images := newController(t)
	class := map[string]string{contract.MaxReadIOPSKey: "100", contract.MaxWriteBPSKey: "50M", contract.MaxWriteIOPSKey: "max"}
	want := host.IOLimits{ReadIOPS: 100, WriteBPS: 50e6}
	id, err := createLimited(t, c, "limited", class)
	if err != nil {
		t.Fatal(err)
	}
	v, err := store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if v.IOLimits == nil || v.IOLimits.Limits != want || v.IOLimits.Generation != v.Generation || v.Provisioning != state.ProvisionThick {
		t.Errorf("got record %+v with limits %+v, want limits %+v recorded with the volume", v, v.IOLimits, want)
	}
	plain := create(t, c, "plain")
	if v, _ := store.Get(plain); v.IOLimits != nil {
		t.Errorf("a volume of no class: got limits %+v, want none", v.IOLimits)
	}

	for _, tc := range []struct {
		name    string
		vname   string
		mutable map[string]string
		code    codes.Code
		msg     string
	}{
		{name: "the same class again", vname: "limited", mutable: class},
		{name: "the same limits, written otherwise", vname: "limited",
			mutable: map[string]string{contract.MaxReadIOPSKey: "100", contract.MaxWriteBPSKey: "50000000", "csi.storage.k8s.io/pvc/name": "c"}},
		{name: "other limits", vname: "limited", mutable: map[string]string{contract.MaxReadIOPSKey: "200"}, code: codes.AlreadyExists, msg: "IO limits"},
		{name: "no class for a volume made with one", vname: "limited", mutable: nil, code: codes.AlreadyExists, msg: "IO limits"},
		{name: "a class for a volume made with none", vname: "plain", mutable: class, code: codes.AlreadyExists, msg: "IO limits"},
		{name: "no class again", vname: "plain", mutable: nil},
		{name: "only max: no limits", vname: "plain", mutable: map[string]string{contract.MaxReadBPSKey: "max"}},
		{name: "an unknown key", vname: "new-unknown", mutable: map[string]string{"XXX_FakeKey": "XXX_FakeValue"}, code: codes.InvalidArgument, msg: "XXX_FakeKey"},
		{name: "below the kernel's least", vname: "new-low", mutable: map[string]string{contract.MaxWriteIOPSKey: "1"}, code: codes.InvalidArgument, msg: contract.MaxWriteIOPSKey},
		{name: "whitespace", vname: "new-space", mutable: map[string]string{contract.MaxReadBPSKey: "1Gi "}, code: codes.InvalidArgument, msg: contract.MaxReadBPSKey},
		{name: "a bad class of an existing volume", vname: "limited", mutable: map[string]string{contract.MaxReadIOPSKey: "0"}, code: codes.InvalidArgument, msg: contract.MaxReadIOPSKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, before := recorded(t, store, id)
			got, err := createLimited(t, c, tc.vname, tc.mutable)
			if code := rpcerr.Code(err); code != tc.code || !strings.Contains(errString(err), tc.msg) {
				t.Fatalf("got %v (%v), want %v with %q", code, err, tc.code, tc.msg)
			}
			if tc.code == codes.OK && got != c.localID(tc.vname) {
				t.Errorf("got volume %s, want %s", got, c.localID(tc.vname))
			}
			if limits, gen := recorded(t, store, id); limits != want || gen != before {
				t.Errorf("the first volume's record: got %+v at generation %d, want %+v at %d", limits, gen, want, before)
			}
			if strings.HasPrefix(tc.vname, "new-") {
				nid := c.localID(tc.vname)
				if _, err := images.Size(nid); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("an image was made for a refused class: %v", err)
				}
				if _, err := store.Get(nid); !errors.Is(err, state.ErrNotFound) {
					t.Errorf("a record was made for a refused class: %v", err)
				}
			}
		})
	}
}
