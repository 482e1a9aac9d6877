package residency

import (
	"errors"
	"testing"
)

// TestLifecycleTable pins every (phase, event) pair of the transition table.
func TestLifecycleTable(t *testing.T) {
	want := map[Phase]map[Event]Phase{
		PhaseAttaching: {EventAttached: PhaseResident, EventAttachFailed: PhaseFailed},
		PhaseResident:  {EventBeginRelease: PhaseReleasing, EventLost: PhaseLost},
		PhaseReleasing: {EventAbortRelease: PhaseResident, EventReleased: PhaseReleased, EventLost: PhaseLost},
	}
	phases := []Phase{PhaseAttaching, PhaseResident, PhaseReleasing, PhaseReleased, PhaseLost, PhaseFailed}
	events := []Event{EventAttached, EventAttachFailed, EventBeginRelease, EventAbortRelease, EventReleased, EventLost}
	for _, p := range phases {
		for _, e := range events {
			got, err := p.Next(e)
			if to, ok := want[p][e]; ok {
				if err != nil || got != to {
					t.Errorf("%s --%s--> %s, %v; want %s", p, e, got, err, to)
				}
				continue
			}
			if !errors.Is(err, ErrIllegalTransition) || got != p {
				t.Errorf("%s --%s--> %s, %v; want refused", p, e, got, err)
			}
		}
		if terminal := len(want[p]) == 0; p.Terminal() != terminal {
			t.Errorf("%s.Terminal() = %v", p, p.Terminal())
		}
	}
	for p, s := range map[Phase]ObservedState{PhaseAttaching: StateAttaching, PhaseResident: StateResident, PhaseReleasing: StateReleasing, PhaseReleased: StateExpired, PhaseLost: StateExpired} {
		if p.Observed() != s {
			t.Errorf("%s observed as %s, want %s", p, p.Observed(), s)
		}
	}
}

// TestLedger covers admission, ownership by generation, and drain.
func TestLedger(t *testing.T) {
	if _, err := NewLedger(0); err == nil {
		t.Fatal("zero capacity accepted")
	}
	l, _ := NewLedger(2)
	a, b, c := Key{"t", "a"}, Key{"t", "b"}, Key{"t", "c"}
	for _, k := range []Key{a, a, b} { // a twice: idempotent
		if err := l.Admit(k); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Admit(c); !errors.Is(err, ErrCapacity) {
		t.Fatalf("third session: %v, want ErrCapacity", err)
	}
	if !l.Own(a, 1) || l.ReleaseOwned(a, 2) {
		t.Fatal("generation 2 credited generation 1's charge")
	}
	if !l.Own(a, 3) || l.ReleaseOwned(a, 1) {
		t.Fatal("a successor's claimed charge was credited by its predecessor")
	}
	if !l.ReleaseOwned(a, 3) || l.InUse() != 1 {
		t.Fatalf("owner could not credit its charge; in use %d", l.InUse())
	}
	l.BeginDrain()
	if !l.Draining() {
		t.Fatal("not draining")
	}
	if err := l.Admit(c); !errors.Is(err, ErrDraining) {
		t.Fatalf("admit while draining: %v", err)
	}
	if !l.Release(b) || l.InUse() != 0 {
		t.Fatal("release")
	}
}

// TestKeyValidate refuses ids that would break subjects, keys or paths.
func TestKeyValidate(t *testing.T) {
	for _, k := range []Key{{"", "s"}, {"t", ""}, {"a.b", "s"}, {"t", "s*"}, {"t", "../x"}, {"t", "a b"}, {"t", string(make([]byte, 65))}} {
		if err := k.Validate(); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%q accepted", k.String())
		}
	}
	if err := (Key{"acme-1", "s_2"}).Validate(); err != nil {
		t.Error(err)
	}
}
