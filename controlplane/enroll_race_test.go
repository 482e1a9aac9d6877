package controlplane_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestEnrollSurvivesConcurrentRecordWrites: writes to a node's record that
// are not enrollments (facts, lost ↔ ready, drain) may land between
// enrollment's read and its write. Enrollment retries over them rather than
// failing after it has already spent the invitation; each success still
// raises the fencing token by exactly one.
func TestEnrollSurvivesConcurrentRecordWrites(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, OpenEnrollment: true})
	first := pl.enroll(t, "n1")
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			// What applyFacts does: a CAS write that leaves the session alone.
			_, _, _ = bus.UpdateJSON(ctx, kv, "n1", func(n *schemas.NodeRecord) error {
				n.FactsReceivedAt = time.Now()
				return nil
			})
		}
	})
	token := first.FencingToken
	for range 30 {
		enr := pl.enroll(t, "n1") // fails the test on a refusal
		if enr.FencingToken != token+1 {
			t.Fatalf("fencing token %d → %d, want +1", token, enr.FencingToken)
		}
		token = enr.FencingToken
	}
	cancel()
	wg.Wait()
}
