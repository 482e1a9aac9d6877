package runs

import (
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// noteOnce adds one note to a Run and changes nothing else.
type noteOnce struct{ msg string }

func (n noteOnce) Apply(r schemas.Run) (schemas.Run, []schemas.RunEvent, error) {
	return r, []schemas.RunEvent{{Type: schemas.EventNote, Phase: r.Phase, Message: n.msg}}, nil
}

// TestEventsStoredInSeqOrder: however many writers change one Run at once,
// WF_EVENTS holds its events in seq order, each once: a later change's
// publish never overtakes an earlier one's.
func TestEventsStoredInSeqOrder(t *testing.T) {
	e := newStoreEnv(t)
	r := e.create(t, "many-writers")
	const writers, each = 6, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := e.store.Advance(e.ctx, r.ID, noteOnce{msg: string(rune('a'+w)) + string(rune('a'+i))}, false); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := seqs(e.events(t, r.ID))
	if len(got) != 1+writers*each {
		t.Fatalf("%d events stored, want %d", len(got), 1+writers*each)
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("event %d in WF_EVENTS has seq %d; want the stream in seq order: %v", i, seq, got)
		}
	}
}
