package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_RentalNeverEnrolls: a rented machine comes up but no agent
// ever enrolls from it (the fake world runs none). Past EnrollTimeout the
// rental is given up — terminated, saying why — instead of holding the Run
// and a rental slot forever, and the Run, still waiting, gets another
// machine.
func TestAcceptance_RentalNeverEnrolls(t *testing.T) {
	p, err := fake.New(fake.Config{Seed: 5, Clock: fake.NewManualClock(time.Now())}) // no latency: running at once
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	f := newFleet(t, func(c *controlplane.Config) {
		c.Capacity = &rentals.Config{Provider: p, OwnershipToken: "wf-e2e", EnrollTimeout: time.Second, Interval: 200 * time.Millisecond}
	})
	id := f.submit(schemas.RunRequest{RequestID: "never-enrolls", Image: w.image.Reference, Command: []string{"true"}})
	var first schemas.Rental
	f.eventually(20*time.Second, "the first rental to be given up", func() bool {
		for _, rt := range f.rentals() {
			if rt.State == schemas.RentalTerminating || rt.State == schemas.RentalTerminated {
				first = rt
				return true
			}
		}
		return false
	})
	if !strings.Contains(first.LastError, "did not enroll") {
		t.Fatalf("abandoned rental says %q", first.LastError)
	}
	if n := p.AllocationCount(first.RentalID); n != 1 {
		t.Fatalf("%d allocations for %s", n, first.RentalID)
	}
	f.eventually(20*time.Second, "another rental for the waiting Run", func() bool {
		for _, rt := range f.rentals() {
			if rt.RentalID != first.RentalID && rt.ForRun == id {
				return true
			}
		}
		return false
	})
	if r, _ := f.run(id); r.Phase != schemas.PhaseAccepted {
		t.Fatalf("the Run is %s; it should still wait for a machine", r.Phase)
	}
}
