package reconciler

import "testing"

// TestEveryKindHasItsEntry fails when a kind of action is added without a
// complete entry in the table: it would have no name, no intent, no policy
// for a final failure, or nothing to run.
func TestEveryKindHasItsEntry(t *testing.T) {
	names := map[string]actionKind{}
	for k := actionKind(0); k < kindCount; k++ {
		s := k.spec()
		if s.name == "" {
			t.Errorf("kind %d has no name", k)
		}
		if other, ok := names[s.name]; ok {
			t.Errorf("kinds %d and %d are both named %q", other, k, s.name)
		}
		names[s.name] = k
		if s.serves == 0 {
			t.Errorf("kind %q serves no intent", s.name)
		}
		if s.final != held && s.final != heldAndAnswered && s.final != withdrawn && s.final != keptStaged {
			t.Errorf("kind %q says nothing of a final failure, or what only an operation's end can (%d)", s.name, s.final)
		}
		if s.run == nil {
			t.Errorf("kind %q runs nothing", s.name)
		}
		// What fulfils an intent sets it up; a repair undoes damage and
		// is counted as one.
		if s.fulfils && (s.teardown || s.repair) {
			t.Errorf("kind %q fulfils its intent but tears down or repairs", s.name)
		}
		if s.repair && !s.counted {
			t.Errorf("kind %q repairs but is not counted as a repair", s.name)
		}
		if s.final == withdrawn && !s.fulfils {
			t.Errorf("kind %q withdraws an intent it does not fulfil", s.name)
		}
	}
}

// TestActionKeys checks the intent each action serves, which keys its
// result and final.
func TestActionKeys(t *testing.T) {
	for _, tc := range []struct {
		act  action
		want string
	}{
		{action{kind: actStage}, "stage"},
		{action{kind: actUnstage}, "stage"},
		{action{kind: actRelease}, "stage"},
		{action{kind: actPublish, target: "/t"}, "publish:/t"},
		{action{kind: actUnpublish, target: "/t"}, "publish:/t"},
		{action{kind: actUnmountTarget, target: "/t"}, "publish:/t"},
		{action{kind: actUnmountStray, target: "/elsewhere"}, "stage"},
		{action{kind: actDetachExtra, target: "/dev/loop9"}, "stage"},
		{action{kind: actGrowDevice}, "expand"},
		{action{kind: actGrowFs}, "expand"},
		{action{kind: actRecordMount}, "stage"},
		{action{kind: actRecordMount, target: "/t"}, "publish:/t"},
		{action{kind: actTakeSnapshot, target: "s1"}, "snapshot:s1"},
		{action{kind: actForgetSnapshot, target: "s1"}, "snapshot:s1"},
		{action{kind: actThaw, target: "/k/staging/v1"}, "stage"},
		{action{kind: actSetIOLimits, target: "/t"}, "ioLimits"},
		{action{kind: actClearIOLimits, target: "/t"}, "publish:/t"},
	} {
		if got := string(tc.act.key()); got != tc.want {
			t.Errorf("%v serves %q, want %q", tc.act, got, tc.want)
		}
	}
}
