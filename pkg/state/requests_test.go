package state

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
)

// requestCase is one request transition on a record: the record it gives,
// or the kind of error it refuses with and a part of its message (the
// record then unchanged).
type requestCase struct {
	name    string
	v       *Volume
	want    *Volume
	kind    classified.Kind
	message string
}

// run applies fn to a copy of tc.v and checks what it made of it.
func (tc requestCase) run(t *testing.T, fn func(v *Volume) error) {
	t.Helper()
	v := tc.v.DeepCopy()
	err := fn(v)
	if tc.want == nil {
		e := classified.AsError(err)
		if e == nil || e.Kind != tc.kind || !strings.Contains(e.Message, tc.message) {
			t.Fatalf("got error %v (%v), want %s with %q", err, e, tc.kind, tc.message)
		}
		if !reflect.DeepEqual(v, tc.v) {
			t.Errorf("a refused request changed the record: got %+v, want %+v", v, tc.v)
		}
		return
	}
	if err != nil {
		t.Fatalf("got error %v, want record %+v", err, tc.want)
	}
	if !reflect.DeepEqual(v, tc.want) {
		t.Errorf("got %s, want %s", show(v), show(tc.want))
	}
}

// show renders a record with its intents, which %+v prints as pointers.
func show(v *Volume) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{id:%s access:%q", v.ID, v.Access)
	if v.Stage != nil {
		fmt.Fprintf(&b, " stage:%+v", *v.Stage)
	}
	for _, t := range v.Targets() {
		fmt.Fprintf(&b, " publish %s:%+v", t, *v.Publishes[t])
	}
	if v.Expand != nil {
		fmt.Fprintf(&b, " expand:%+v", *v.Expand)
	}
	if v.IOLimits != nil {
		fmt.Fprintf(&b, " ioLimits:%+v", *v.IOLimits)
	}
	return b.String() + "}"
}

// volume is a record of id "v" with the given stage and publishes by
// target.
func volume(st *Stage, pubs map[string]*Publish) *Volume {
	return &Volume{ID: "v", Generation: 9, Stage: st, Publishes: pubs}
}

func TestRequestStage(t *testing.T) {
	fs := &Stage{Path: "/s", Access: AccessMount, FsType: "ext4", AccessMode: "SINGLE_NODE_WRITER", MountFlags: []string{"noatime"}}
	block := &Stage{Path: "/s", Access: AccessBlock, AccessMode: "SINGLE_NODE_WRITER"}
	with := func(st *Stage, f func(st *Stage)) *Stage {
		c := *st
		f(&c)
		return &c
	}
	withdrawn := with(fs, func(st *Stage) { st.Deleting, st.Generation, st.MountID = true, 4, 7 })
	live := with(fs, func(st *Stage) { st.Generation, st.MountID = 4, 7 })
	for _, tc := range []struct {
		requestCase
		spec *Stage
	}{
		{spec: fs, requestCase: requestCase{name: "first stage", v: volume(nil, nil), want: volume(fs, nil)}},
		{spec: block, requestCase: requestCase{name: "a block stage marks the volume written raw", v: volume(nil, nil),
			want: &Volume{ID: "v", Generation: 9, Stage: block, Access: AccessBlock}}},
		{spec: fs, requestCase: requestCase{name: "a duplicate changes nothing", v: volume(live, nil), want: volume(live, nil)}},
		{spec: fs, requestCase: requestCase{name: "a duplicate cancels its own withdrawal", v: volume(withdrawn, nil), want: volume(live, nil)}},
		{spec: fs, requestCase: requestCase{name: "a volume being removed",
			v: &Volume{ID: "v", Removing: true}, kind: classified.KindNotFound, message: "volume v is being deleted"}},
		{spec: fs, requestCase: requestCase{name: "a filesystem on a volume written raw",
			v: &Volume{ID: "v", Access: AccessBlock}, kind: classified.KindFailedPrecondition, message: contract.AllowModeChangeKey}},
		{spec: fs, requestCase: requestCase{name: "a filesystem on a volume written raw and staged so again",
			v: &Volume{ID: "v", Access: AccessBlock, Stage: block}, kind: classified.KindAlreadyExists, message: "with another capability"}},
		{spec: with(fs, func(st *Stage) { st.FsType = "xfs" }), requestCase: requestCase{name: "another spec while the stage is torn down",
			v: volume(withdrawn, nil), kind: classified.KindAborted, message: "still being unstaged from /s; retry later"}},
		{spec: with(fs, func(st *Stage) { st.Path = "/other" }), requestCase: requestCase{name: "another staging path",
			v: volume(live, nil), kind: classified.KindAlreadyExists, message: "volume v is already staged at /s"}},
		{spec: with(fs, func(st *Stage) { st.MountFlags = nil }), requestCase: requestCase{name: "other mount flags",
			v: volume(live, nil), kind: classified.KindAlreadyExists, message: "already staged at /s with another capability, fs type or mount flags"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := *tc.spec
			tc.run(t, func(v *Volume) error { return v.RequestStage(&spec) })
		})
	}
}

func TestRequestUnstage(t *testing.T) {
	st := &Stage{Path: "/s", Access: AccessMount, Generation: 3}
	gone := &Stage{Path: "/s", Access: AccessMount, Generation: 3, Deleting: true}
	pub := func(deleting bool) *Publish { return &Publish{Access: AccessMount, Deleting: deleting} }
	for _, tc := range []struct {
		requestCase
		path string
	}{
		{path: "/s", requestCase: requestCase{name: "withdraws the stage", v: volume(st, nil), want: volume(gone, nil)}},
		{path: "/s", requestCase: requestCase{name: "withdrawn already", v: volume(gone, nil), want: volume(gone, nil)}},
		{path: "/s", requestCase: requestCase{name: "publishes being withdrawn do not hold it",
			v: volume(st, map[string]*Publish{"/t": pub(true)}), want: volume(gone, map[string]*Publish{"/t": pub(true)})}},
		{path: "/s", requestCase: requestCase{name: "never staged", v: volume(nil, nil), want: volume(nil, nil)}},
		{path: "/other", requestCase: requestCase{name: "staged elsewhere", v: volume(st, nil), want: volume(st, nil)}},
		{path: "/s", requestCase: requestCase{name: "live publishes hold it, named in order",
			v:    volume(st, map[string]*Publish{"/t2": pub(false), "/t1": pub(false), "/t0": pub(true)}),
			kind: classified.KindFailedPrecondition, message: "volume v is still published at /t1, /t2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, func(v *Volume) error { return v.RequestUnstage(tc.path) })
		})
	}
}

func TestRequestPublish(t *testing.T) {
	st := &Stage{Path: "/s", Access: AccessMount, Generation: 3}
	rw := &Publish{Access: AccessMount, AccessMode: "SINGLE_NODE_MULTI_WRITER"}
	single := &Publish{Access: AccessMount, AccessMode: SingleWriter}
	ro := &Publish{Access: AccessMount, AccessMode: "SINGLE_NODE_MULTI_WRITER", ReadOnly: true}
	at := func(p *Publish, gen int64, deleting bool) *Publish {
		c := *p
		c.Generation, c.Deleting, c.MountID = gen, deleting, 5
		return &c
	}
	pubs := func(kv ...any) map[string]*Publish {
		m := map[string]*Publish{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1].(*Publish)
		}
		return m
	}
	for _, tc := range []struct {
		requestCase
		staging string
		spec    *Publish
	}{
		{spec: rw, requestCase: requestCase{name: "first publish", v: volume(st, nil), want: volume(st, pubs("/t", rw))}},
		{spec: rw, requestCase: requestCase{name: "a second target",
			v: volume(st, pubs("/u", at(rw, 4, false))), want: volume(st, pubs("/u", at(rw, 4, false), "/t", rw))}},
		{spec: rw, requestCase: requestCase{name: "a duplicate changes nothing",
			v: volume(st, pubs("/t", at(rw, 4, false))), want: volume(st, pubs("/t", at(rw, 4, false)))}},
		{spec: rw, requestCase: requestCase{name: "a duplicate cancels its own withdrawal",
			v: volume(st, pubs("/t", at(rw, 4, true))), want: volume(st, pubs("/t", at(rw, 4, false)))}},
		{spec: single, requestCase: requestCase{name: "single writer beside a withdrawn publish",
			v: volume(st, pubs("/u", at(rw, 4, true))), want: volume(st, pubs("/u", at(rw, 4, true), "/t", single))}},
		{spec: rw, requestCase: requestCase{name: "not staged", v: volume(nil, nil), kind: classified.KindFailedPrecondition, message: "volume v is not staged"}},
		{spec: rw, requestCase: requestCase{name: "stage being withdrawn",
			v: volume(&Stage{Path: "/s", Access: AccessMount, Deleting: true}, nil), kind: classified.KindFailedPrecondition, message: "volume v is not staged"}},
		{staging: "/other", spec: rw, requestCase: requestCase{name: "staged elsewhere",
			v: volume(st, nil), kind: classified.KindFailedPrecondition, message: "volume v is staged at /s, not /other"}},
		{spec: &Publish{Access: AccessBlock}, requestCase: requestCase{name: "another access type",
			v: volume(st, nil), kind: classified.KindFailedPrecondition, message: "volume v is staged with access type mount, not block"}},
		{spec: ro, requestCase: requestCase{name: "other options at the target",
			v: volume(st, pubs("/t", at(rw, 4, false))), kind: classified.KindAlreadyExists, message: "already published at /t with other options"}},
		{spec: ro, requestCase: requestCase{name: "other options while the target is torn down",
			v: volume(st, pubs("/t", at(rw, 4, true))), kind: classified.KindAborted, message: "still being unpublished from /t; retry later"}},
		{spec: single, requestCase: requestCase{name: "single writer beside a live publish",
			v: volume(st, pubs("/u", at(rw, 4, false))), kind: classified.KindFailedPrecondition, message: "volume v is SINGLE_NODE_SINGLE_WRITER and already published at /u"}},
		{spec: rw, requestCase: requestCase{name: "beside a live single writer",
			v: volume(st, pubs("/u", at(single, 4, false))), kind: classified.KindFailedPrecondition, message: "already published at /u"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			staging := tc.staging
			if staging == "" {
				staging = "/s"
			}
			spec := *tc.spec
			tc.run(t, func(v *Volume) error { return v.RequestPublish(staging, "/t", &spec) })
		})
	}
}

func TestRequestUnpublish(t *testing.T) {
	st := &Stage{Path: "/s", Access: AccessMount, Generation: 3}
	p := func(deleting bool) map[string]*Publish {
		return map[string]*Publish{"/t": {Access: AccessMount, Generation: 4, Deleting: deleting}}
	}
	for _, tc := range []requestCase{
		{name: "withdraws the publish", v: volume(st, p(false)), want: volume(st, p(true))},
		{name: "withdrawn already", v: volume(st, p(true)), want: volume(st, p(true))},
		{name: "never published there", v: volume(st, nil), want: volume(st, nil)},
		{name: "unknown volume", v: &Volume{ID: "v"}, want: &Volume{ID: "v"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, func(v *Volume) error { return v.RequestUnpublish("/t") })
		})
	}
}

func TestRequestExpand(t *testing.T) {
	st := &Stage{Path: "/s", Access: AccessMount, Generation: 3}
	expanding := func(bytes, gen int64) *Volume {
		v := volume(st, nil)
		v.Expand = &Expand{Bytes: bytes, Generation: gen}
		return v
	}
	for _, tc := range []struct {
		requestCase
		bytes int64
		retry bool
	}{
		{bytes: 10, requestCase: requestCase{name: "first expansion", v: volume(st, nil), want: expanding(10, 0)}},
		{bytes: 10, requestCase: requestCase{name: "the same size again", v: expanding(10, 5), want: expanding(10, 5)}},
		{bytes: 10, retry: true, requestCase: requestCase{name: "the same size after it failed for good is new", v: expanding(10, 5), want: expanding(10, 0)}},
		{bytes: 8, requestCase: requestCase{name: "a smaller size supersedes a larger one", v: expanding(10, 5), want: expanding(8, 0)}},
		{bytes: 10, requestCase: requestCase{name: "not staged", v: volume(nil, nil), kind: classified.KindNotFound, message: "volume v is not staged"}},
		{bytes: 10, requestCase: requestCase{name: "stage being withdrawn",
			v: volume(&Stage{Path: "/s", Deleting: true}, nil), kind: classified.KindNotFound, message: "volume v is not staged"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, func(v *Volume) error { return v.RequestExpand(tc.bytes, tc.retry) })
		})
	}
}

func TestRequestSnapshot(t *testing.T) {
	group := &GroupIntent{ID: "g"}
	with := func(in map[string]*SnapshotIntent) *Volume {
		v := volume(nil, nil)
		v.Snapshots = in
		return v
	}
	removing := volume(nil, nil)
	removing.Removing = true
	for _, tc := range []struct {
		requestCase
		group *GroupIntent
	}{
		{requestCase: requestCase{name: "a first snapshot", v: volume(nil, nil), want: with(map[string]*SnapshotIntent{"s": {}})}},
		{group: group, requestCase: requestCase{name: "a group's, kept by its leader", v: volume(nil, nil),
			want: with(map[string]*SnapshotIntent{"s": {Group: group}})}},
		{requestCase: requestCase{name: "asked again: the intent kept as it is",
			v: with(map[string]*SnapshotIntent{"s": {Generation: 4}}), want: with(map[string]*SnapshotIntent{"s": {Generation: 4}})}},
		{requestCase: requestCase{name: "beside another",
			v: with(map[string]*SnapshotIntent{"r": {Generation: 2}}), want: with(map[string]*SnapshotIntent{"r": {Generation: 2}, "s": {}})}},
		{requestCase: requestCase{name: "a volume being deleted", v: removing, kind: classified.KindNotFound, message: "v"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, func(v *Volume) error { return v.RequestSnapshot("s", tc.group) })
		})
	}
}

// TestRecordMadeThenForgotten records a volume made, as CreateVolume does
// before its image, and forgets it, as when the image was not made: every
// field RecordMade sets is set by it, and ForgetMade clears each, so that
// a record that was not made accounts for nothing.
func TestRecordMadeThenForgotten(t *testing.T) {
	limits := host.IOLimits{ReadIOPS: 100, WriteBPS: 1 << 20}
	for _, tc := range []struct {
		name, id, vname, pool string
		limits                host.IOLimits
		want                  Volume
	}{
		{"in a pool of its own, named apart from its ID", "n_node", "n", "fast", host.IOLimits{},
			Volume{ID: "n_node", Name: "n", Pool: "fast", Provisioning: ProvisionThick, Access: AccessMount}},
		{"in the default pool, the ID its name", "n", "n", DefaultPool, host.IOLimits{},
			Volume{ID: "n", Provisioning: ProvisionThick, Access: AccessMount}},
		{"with its class's IO limits", "n", "n", DefaultPool, limits,
			Volume{ID: "n", Provisioning: ProvisionThick, Access: AccessMount, IOLimits: &IOLimitsIntent{Limits: limits}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Volume{ID: tc.id}
			v.RecordMade(tc.vname, tc.pool, ProvisionThick, AccessMount, tc.limits)
			if !reflect.DeepEqual(v, tc.want) {
				t.Errorf("recorded %+v, want %+v", v, tc.want)
			}
			v.ForgetMade()
			if want := (Volume{ID: tc.id}); !reflect.DeepEqual(v, want) {
				t.Errorf("forgotten: %+v, want %+v", v, want)
			}
		})
	}
	block := Volume{ID: "b", Access: AccessBlock}
	block.RecordMade("b", DefaultPool, ProvisionThin, AccessMount, host.IOLimits{})
	if block.Access != AccessBlock {
		t.Errorf("a record that says block recorded as %q, want it to stay block", block.Access)
	}
}

func TestRequestIOLimits(t *testing.T) {
	limits := host.IOLimits{ReadIOPS: 100, WriteBPS: 1 << 20}
	limited := func(l host.IOLimits, gen int64) *Volume {
		v := volume(nil, nil)
		v.IOLimits = &IOLimitsIntent{Limits: l, Generation: gen}
		return v
	}
	removing := limited(limits, 4)
	removing.Removing = true
	for _, tc := range []struct {
		requestCase
		limits host.IOLimits
	}{
		{limits: limits, requestCase: requestCase{name: "first limits", v: volume(nil, nil), want: limited(limits, 0)}},
		{limits: limits, requestCase: requestCase{name: "the same limits again", v: limited(limits, 4), want: limited(limits, 4)}},
		{limits: host.IOLimits{ReadIOPS: 50}, requestCase: requestCase{name: "other limits replace them",
			v: limited(limits, 4), want: limited(host.IOLimits{ReadIOPS: 50}, 0)}},
		{requestCase: requestCase{name: "every limit removed: the intent stays, with none",
			v: limited(limits, 4), want: limited(host.IOLimits{}, 0)}},
		{requestCase: requestCase{name: "no limits of a volume never limited", v: volume(nil, nil), want: volume(nil, nil)}},
		{requestCase: requestCase{name: "no limits again", v: limited(host.IOLimits{}, 6), want: limited(host.IOLimits{}, 6)}},
		{limits: limits, requestCase: requestCase{name: "a volume being deleted", v: removing, kind: classified.KindNotFound, message: "v"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, func(v *Volume) error { return v.RequestIOLimits(tc.limits) })
		})
	}
}

// TestRequestIOLimitsTouchesOnlyItsField applies RequestIOLimits to a
// record with every field set and checks that the IO limits are all it
// changed: the node's intents, the provenance and the other requests'
// fields are not its business.
func TestRequestIOLimitsTouchesOnlyItsField(t *testing.T) {
	v, want := filled(t), filled(t)
	v.Removing, want.Removing = false, false
	limits := host.IOLimits{ReadIOPS: 3, WriteIOPS: 4, ReadBPS: 5, WriteBPS: 6}
	if err := v.RequestIOLimits(limits); err != nil {
		t.Fatal(err)
	}
	if got := v.WantsIOLimits(); got != limits {
		t.Errorf("got limits %+v, want %+v", got, limits)
	}
	typ := reflect.TypeFor[Volume]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		if name == "IOLimits" {
			continue
		}
		if got, w := reflect.ValueOf(v).Elem().Field(i).Interface(), reflect.ValueOf(want).Elem().Field(i).Interface(); !reflect.DeepEqual(got, w) {
			t.Errorf("RequestIOLimits changed %s: got %v, want %v", name, got, w)
		}
	}
}
