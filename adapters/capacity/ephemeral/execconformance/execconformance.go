// Package execconformance is the test suite every ephemeral.Executor runs:
// it checks that the executor's declared EphemeralSupport matches what it
// does — one launch key, one execution; a queued execution cancelled
// before it runs; a standing pool never terminated; only our executions
// listed — so the control plane can rely on each promise.
package execconformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// Options tells the suite how to drive one executor. Every hook receives
// the executor the suite built.
type Options struct {
	// Query is what the suite asks ListOffers; its first offer is used.
	Query ephemeral.OfferQuery
	// Hold keeps new executions queued (true) or lets them run (false).
	// Nil skips the cancel-before-run check.
	Hold func(t *testing.T, e ephemeral.Executor, on bool)
	// LoseNextLaunch makes the next launch's answer be lost after the
	// provider queued it. Nil skips the lost-answer check.
	LoseNextLaunch func(t *testing.T, e ephemeral.Executor)
	// Launches counts executions the provider queued. Nil skips the
	// count checks.
	Launches func(t *testing.T, e ephemeral.Executor) int
	// Advance moves a virtual clock; nil polls in real time.
	Advance func(e ephemeral.Executor, d time.Duration)
	// Settle bounds how long an execution may take to end (30s).
	Settle time.Duration
}

// Run runs every check as a subtest, each against a fresh executor.
func Run(t *testing.T, newExecutor func(t *testing.T) ephemeral.Executor, opts Options) {
	t.Helper()
	if opts.Settle <= 0 {
		opts.Settle = 30 * time.Second
	}
	for _, c := range []struct {
		name string
		run  func(h *harness)
	}{
		{"Declaration", checkDeclaration},
		{"Offers", checkOffers},
		{"RunsToTheEnd", checkRunsToTheEnd},
		{"LaunchKeyLaunchesOnce", checkLaunchOnce},
		{"LostLaunchAnswerFound", checkLostLaunch},
		{"CancelQueued", checkCancelQueued},
		{"ReleaseIsIdempotent", checkReleaseIdempotent},
		{"StandingPoolNotTerminated", checkTerminate},
		{"ListOwnedReturnsOnlyOurs", checkListOwned},
		{"UnknownExecutionNotFound", checkNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newExecutor(t)
			c.run(&harness{t: t, e: e, o: opts, s: e.Support(), ctx: t.Context()})
		})
	}
}

type harness struct {
	t   *testing.T
	e   ephemeral.Executor
	o   Options
	s   capacity.EphemeralSupport
	ctx context.Context
	seq int
}

func (h *harness) offer() ephemeral.Offer {
	h.t.Helper()
	offers, err := h.e.ListOffers(h.ctx, h.o.Query)
	if err != nil || len(offers) == 0 {
		h.t.Fatalf("ListOffers(%+v): %v, %v", h.o.Query, offers, err)
	}
	return offers[0]
}

func (h *harness) request(owner string) ephemeral.LaunchRequest {
	h.seq++
	return ephemeral.LaunchRequest{ConnectionID: "conformance", LaunchKey: fmt.Sprintf("r-%d-a1", h.seq), RunID: fmt.Sprintf("r-%d", h.seq), Attempt: 1,
		OwnershipToken: owner, OfferID: h.offer().ID, Input: ephemeral.Input{Command: []string{"echo", "hello"}}, ExecutionTimeoutSeconds: 600, TTLSeconds: 3600}
}

func (h *harness) launch(req ephemeral.LaunchRequest) (ephemeral.LaunchReceipt, ephemeral.Ref) {
	h.t.Helper()
	rc, err := h.e.Launch(h.ctx, req)
	if err != nil {
		h.t.Fatalf("Launch: %v", err)
	}
	return rc, ephemeral.Ref{ConnectionID: req.ConnectionID, ExecutionID: rc.ExecutionID, OfferID: req.OfferID, OwnershipToken: req.OwnershipToken}
}

// await observes ref until done holds, failing after Settle.
func (h *harness) await(ref ephemeral.Ref, what string, done func(ephemeral.Execution) bool) ephemeral.Execution {
	h.t.Helper()
	step := 50 * time.Millisecond
	for waited := time.Duration(0); ; waited += step {
		x, err := h.e.Observe(h.ctx, ref)
		if err != nil {
			h.t.Fatalf("Observe %s: %v", ref.ExecutionID, err)
		}
		if !x.State.Valid() {
			h.t.Fatalf("execution %s in state %q", ref.ExecutionID, x.State)
		}
		if done(x) {
			return x
		}
		if waited > h.o.Settle {
			h.t.Fatalf("execution %s: %s not reached after %s; last %+v", ref.ExecutionID, what, h.o.Settle, x)
		}
		if h.o.Advance != nil {
			h.o.Advance(h.e, 10*time.Second)
		} else {
			time.Sleep(step)
		}
	}
}

func checkDeclaration(h *harness) {
	d, ok := h.e.(capacity.Declarer)
	if !ok {
		h.t.Fatalf("%T does not implement capacity.Declarer", h.e)
	}
	decl := d.Declaration()
	if decl.Type == "" || decl.Lane != capacity.LaneEphemeral || decl.Capacity != nil || decl.Ephemeral == nil || *decl.Ephemeral != h.s {
		h.t.Errorf("declaration %+v; want its type, the ephemeral lane, and Ephemeral = Support() %+v", decl, h.s)
	}
	if err := h.s.Validate(); err != nil {
		h.t.Errorf("support contradicts itself: %v", err)
	}
	if err := h.e.Verify(h.ctx); err != nil {
		h.t.Errorf("Verify: %v", err)
	}
}

func checkOffers(h *harness) {
	offers, err := h.e.ListOffers(h.ctx, h.o.Query)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, o := range offers {
		if !h.o.Query.Matches(o) || o.ID == "" || o.PricePerHour.MicrosPerHour < 0 || o.GPUCount < 0 {
			h.t.Errorf("offer %+v does not answer %+v", o, h.o.Query)
		}
	}
	other := h.o.Query
	other.Image = "registry.example/none@sha256:" + fmt.Sprintf("%064d", 0)
	if none, err := h.e.ListOffers(h.ctx, other); err != nil || len(none) != 0 {
		h.t.Errorf("offers for an image no place runs: %v, %v", none, err)
	}
}

func checkRunsToTheEnd(h *harness) {
	_, ref := h.launch(h.request("wf-conformance"))
	x := h.await(ref, "the end", func(x ephemeral.Execution) bool { return x.State.Ended() })
	if x.State != ephemeral.StateSucceeded || len(x.Output) == 0 || len(x.Output) > ephemeral.MaxOutputBytes {
		h.t.Fatalf("ended %+v; want succeeded with its output", x)
	}
}

func checkLaunchOnce(h *harness) {
	if h.s.IdempotentLaunch == capacity.IdempotencyNone {
		h.t.Skip("Support.IdempotentLaunch is none: a repeated launch is the caller's to avoid")
	}
	req := h.request("wf-conformance")
	first, _ := h.launch(req)
	again, _ := h.launch(req)
	if !again.Duplicate || again.ExecutionID != first.ExecutionID {
		h.t.Fatalf("second launch %+v; want the first's execution %s as a duplicate", again, first.ExecutionID)
	}
	if h.o.Launches != nil && h.o.Launches(h.t, h.e) != 1 {
		h.t.Fatalf("%d executions queued for one launch key", h.o.Launches(h.t, h.e))
	}
}

func checkLostLaunch(h *harness) {
	if h.o.LoseNextLaunch == nil {
		h.t.Skip("Options.LoseNextLaunch not set")
	}
	req := h.request("wf-conformance")
	h.o.LoseNextLaunch(h.t, h.e)
	_, err := h.e.Launch(h.ctx, req)
	if err == nil || !capacity.Ambiguous(err) {
		h.t.Fatalf("a lost answer gave %v; want an uncoded error", err)
	}
	if !h.s.ListOwned {
		h.t.Skip("Support.ListOwned is false: a lost launch is bounded by the provider's TTL only")
	}
	owned, err := h.e.ListOwned(h.ctx, capacity.OwnershipQuery{OwnershipToken: req.OwnershipToken})
	if err != nil {
		h.t.Fatal(err)
	}
	found := 0
	for _, o := range owned {
		if o.LaunchKey == req.LaunchKey {
			found++
		}
	}
	if found != 1 {
		h.t.Fatalf("ListOwned found the lost launch %d times: %+v", found, owned)
	}
	if h.s.IdempotentLaunch != capacity.IdempotencyNone {
		if rc, _ := h.launch(req); !rc.Duplicate {
			h.t.Fatalf("the launch asked again made another execution: %+v", rc)
		}
	}
}

func checkCancelQueued(h *harness) {
	if !h.s.CancelQueued {
		h.t.Skip("Support.CancelQueued is false")
	}
	if h.o.Hold == nil {
		h.t.Skip("Options.Hold not set")
	}
	h.o.Hold(h.t, h.e, true)
	_, ref := h.launch(h.request("wf-conformance"))
	if x, err := h.e.Observe(h.ctx, ref); err != nil || x.State != ephemeral.StateQueued {
		h.t.Fatalf("held execution %+v, %v; want queued", x, err)
	}
	if _, err := h.e.Release(h.ctx, ref); err != nil {
		h.t.Fatalf("Release a queued execution: %v", err)
	}
	h.o.Hold(h.t, h.e, false)
	x := h.await(ref, "cancelled", func(x ephemeral.Execution) bool { return x.State.Ended() || x.State == ephemeral.StateRunning })
	if x.State != ephemeral.StateCancelled {
		h.t.Fatalf("a released queued execution became %s; want cancelled, never run", x.State)
	}
}

func checkReleaseIdempotent(h *harness) {
	_, ref := h.launch(h.request("wf-conformance"))
	if _, err := h.e.Release(h.ctx, ref); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.e.Release(h.ctx, ref); err != nil {
		h.t.Fatalf("second release: %v", err)
	}
}

func checkTerminate(h *harness) {
	if !h.s.StandingPool {
		h.t.Skip("not a standing pool")
	}
	_, ref := h.launch(h.request("wf-conformance"))
	if _, err := h.e.Terminate(h.ctx, ref); !errors.Is(err, capacity.ErrUnsupported) {
		h.t.Fatalf("Terminate on a standing pool: %v; want unsupported", err)
	}
	_, _ = h.e.Release(h.ctx, ref)
}

func checkListOwned(h *harness) {
	if !h.s.ListOwned {
		h.t.Skip("Support.ListOwned is false")
	}
	ours := h.request("wf-conformance")
	h.launch(ours)
	h.launch(h.request("someone-else"))
	owned, err := h.e.ListOwned(h.ctx, capacity.OwnershipQuery{OwnershipToken: "wf-conformance"})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(owned) != 1 || owned[0].LaunchKey != ours.LaunchKey || owned[0].OwnershipToken != "wf-conformance" {
		h.t.Fatalf("owned %+v; want only %s", owned, ours.LaunchKey)
	}
}

func checkNotFound(h *harness) {
	ref := ephemeral.Ref{ConnectionID: "conformance", ExecutionID: "no-such-execution", OfferID: h.offer().ID, OwnershipToken: "wf-conformance"}
	if _, err := h.e.Observe(h.ctx, ref); !errors.Is(err, capacity.ErrNotFound) {
		h.t.Fatalf("Observe an unknown execution: %v; want not found", err)
	}
}
