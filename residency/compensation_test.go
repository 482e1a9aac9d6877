package residency

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestAcceptance_AttachCompensation injects a failure at every attach step
// in turn, then a failing compensation on top. After each, nothing of the
// session is held — lease, admission charge, workspace, runtime, route,
// registry entry — unless the error's Unreleased names it.
func TestAcceptance_AttachCompensation(t *testing.T) {
	start := time.Now()
	env := newBus(t)
	ct := newContainerd(t)
	const ttl = 2 * time.Second
	cp := newControlPlane(t, env, SystemClock{}, ttl, 0)
	durable := newMemDurable()
	rlog := watchResidency(t, env)
	rec := &recorder{}
	h := newHost(t, hostConfig{id: "host-c", cp: cp, env: env, durable: durable, runtime: ct.rt, target: ct.target, handler: rec.handler("host-c")})
	workloadsOf := func(key Key) func() []string {
		return func() []string {
			var out []string
			for _, w := range ct.workloads(t) {
				if strings.Contains(w, "-"+key.Session+"-") {
					out = append(out, w)
				}
			}
			return out
		}
	}

	type tc struct {
		name       string
		step       Step
		code       Code
		faults     []string
		setup      func(key Key) Request // nil: resume of seeded state
		unreleased []string
	}
	cases := []tc{
		{name: "wrong tenant", step: StepValidate, code: CodeForbidden, setup: func(k Key) Request {
			r := request(k, ModeResume)
			r.Principal.TenantID = "other"
			return r
		}},
		{name: "no actor", step: StepValidate, code: CodeInvalidRequest, setup: func(k Key) Request {
			r := request(k, ModeResume)
			r.Principal.ActorID = ""
			return r
		}},
		{name: "placed for another build", step: StepValidate, code: CodeRuntimeMismatch, setup: func(k Key) Request {
			r := request(k, ModeResume)
			r.CompatibilityID = "other-build"
			return r
		}},
		{name: "admit", step: StepAdmit, code: CodeUnavailable, faults: []string{"admissions.admit"}},
		{name: "lease", step: StepLease, code: CodeUnavailable, faults: []string{"leases.acquire"}},
		// A grant whose answer was lost is given back by the compensation…
		{name: "lease granted, answer lost", step: StepLease, code: CodeUnavailable, faults: []string{"leases.acquire.lost"}},
		// …and named held, reachable as the *LeaseCleanupError, if it cannot be.
		{name: "lease granted, answer lost, give-back fails", step: StepLease, code: CodeUnavailable,
			faults: []string{"leases.acquire.lost", "leases.release"}, unreleased: []string{"lease"}},
		{name: "load", step: StepLoad, code: CodeUnavailable, faults: []string{"durable.load"}},
		{name: "restore onto another build", step: StepLoad, code: CodeRuntimeMismatch, setup: func(k Key) Request {
			durable.seed(k, "older-build")
			return request(k, ModeResume)
		}},
		{name: "empty namespace", step: StepLoad, code: CodeNamespaceMissing, setup: func(k Key) Request {
			durable.set(k, SessionState{Exists: true, CompatibilityID: compatA})
			return request(k, ModeResume)
		}},
		{name: "create over unknown journal", step: StepLoad, code: CodeJournalUnknown, setup: func(k Key) Request {
			durable.set(k, SessionState{Namespace: "ns/x", RuntimeJournal: JournalUnknown})
			return request(k, ModeCreate)
		}},
		{name: "resume of nothing", step: StepLoad, code: CodeNotFound, setup: func(k Key) Request { return request(k, ModeResume) }},
		{name: "workspace", step: StepWorkspace, code: CodeWorkspace, faults: []string{"workspaces.ensure"}},
		{name: "launch", step: StepLaunch, code: CodeLaunch, faults: []string{"runtime.launch"}},
		{name: "publish attaching", step: StepAttaching, code: CodePublish, faults: []string{"locations.publish.attaching"}},
		{name: "publish resident", step: StepResident, code: CodePublish, faults: []string{"locations.publish.resident"}},
		{name: "consume", step: StepConsume, code: CodeInbox, faults: []string{"inboxes.open"}},
		// A compensation that itself fails is named, and only it is held.
		{name: "consume, runtime removal fails", step: StepConsume, code: CodeInbox,
			faults: []string{"inboxes.open", "runtime.remove"}, unreleased: []string{"runtime"}},
		{name: "resident, tombstone fails", step: StepResident, code: CodePublish,
			faults: []string{"locations.publish.resident", "locations.tombstone"}, unreleased: []string{"location"}},
		{name: "consume, workspace release fails", step: StepConsume, code: CodeInbox,
			faults: []string{"inboxes.open", "workspaces.release"}, unreleased: []string{"workspace"}},
		{name: "launch, lease release fails", step: StepLaunch, code: CodeLaunch,
			faults: []string{"runtime.launch", "leases.release"}, unreleased: []string{"lease"}},
		{name: "load, admission credit fails", step: StepLoad, code: CodeUnavailable,
			faults: []string{"durable.load", "admissions.release"}, unreleased: []string{"admission"}},
		{name: "consume, everything fails", step: StepConsume, code: CodeInbox,
			faults:     []string{"inboxes.open", "runtime.remove", "locations.tombstone", "workspaces.release", "leases.release", "admissions.release"},
			unreleased: []string{"location", "runtime", "workspace", "lease", "admission"}},
	}
	covered := map[Step]bool{}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			key := Key{tenant, fmt.Sprintf("comp%02d", i)}
			req := request(key, ModeResume)
			if c.setup != nil {
				req = c.setup(key)
			} else {
				durable.seed(key, compatA)
			}
			h.faults.inject(c.faults...)
			r, err := h.mgr.Attach(ctx, req)
			h.faults.clear()
			var ae *AttachError
			if !errors.As(err, &ae) {
				t.Fatalf("attach: %+v, %v; want an *AttachError", r, err)
			}
			covered[ae.Step] = true
			if ae.Step != c.step || ae.Code != c.code || ae.Key != key {
				t.Fatalf("failed at step %d (%s) with %s; want step %d (%s) with %s: %v", ae.Step, ae.Step, ae.Code, c.step, c.step, c.code, ae)
			}
			if c.code == CodeRuntimeMismatch && ae.RuntimeCompatibilityID != compatA {
				t.Errorf("runtime_mismatch without this host's build: %q", ae.RuntimeCompatibilityID)
			}
			if len(c.faults) > 0 && !errors.Is(err, errInjected) {
				t.Errorf("cause lost: %v", err)
			}
			var owed *LeaseCleanupError
			if slices.Contains(c.faults, "leases.acquire.lost") && !errors.As(err, &owed) {
				t.Errorf("a lost grant's attach error does not reach the *LeaseCleanupError: %v", err)
			}
			if !slices.Equal(ae.Unreleased, c.unreleased) || len(ae.UnreleasedCauses) != len(ae.Unreleased) {
				t.Fatalf("unreleased %v (causes %v); want %v", ae.Unreleased, ae.UnreleasedCauses, c.unreleased)
			}
			for i, cause := range ae.UnreleasedCauses {
				// The ledger answers a bool; the admission cause is ours.
				if ae.Unreleased[i] != "admission" && !errors.Is(cause, errInjected) {
					t.Errorf("unreleased cause %v is not the injected one", cause)
				}
			}
			got := held(t, cp, h, key, workloadsOf(key))
			if want := expectHeld(c.unreleased); !sameKinds(got, want) {
				t.Fatalf("held after the failure: %v; want exactly %v", got, want)
			}
			if err := rlog.check(key); err != nil {
				t.Fatal(err)
			}
			cleanUp(t, h, ct, key)
		})
	}
	for _, s := range Steps() {
		if !covered[s] {
			t.Errorf("no case fails at step %d (%s)", s, s)
		}
	}

	// Lease held by someone else: refused, and nothing of ours kept.
	t.Run("lease held elsewhere", func(t *testing.T) {
		ctx := testCtx(t)
		key := Key{tenant, "held"}
		durable.seed(key, compatA)
		if _, err := cp.leases.AcquireSessionLease(ctx, key, "intruder"); err != nil {
			t.Fatal(err)
		}
		_, err := h.mgr.Attach(ctx, request(key, ModeResume))
		var ae *AttachError
		if !errors.As(err, &ae) || ae.Step != StepLease || ae.Code != CodeLeaseHeld || !errors.Is(err, ErrLeaseHeld) || !ae.TookNothing() {
			t.Fatalf("attach: %v", err)
		}
		got := held(t, cp, h, key, workloadsOf(key))
		if len(got) != 1 || !strings.HasPrefix(got[0], "lease") || !strings.Contains(got[0], "intruder") {
			t.Fatalf("held %v; want only the intruder's lease", got)
		}
	})

	// And a clean attach still works on the same host afterwards.
	t.Run("clean attach", func(t *testing.T) {
		ctx := testCtx(t)
		key := Key{tenant, "clean"}
		durable.seed(key, compatA)
		r, err := h.mgr.Attach(ctx, request(key, ModeResume))
		if err != nil || !r.Attached {
			t.Fatalf("%+v %v", r, err)
		}
		if err := h.mgr.Release(ctx, key); err != nil {
			t.Fatal(err)
		}
		if got := held(t, cp, h, key, workloadsOf(key)); len(got) != 0 {
			t.Fatalf("held after release: %v", got)
		}
	})
	t.Logf("total %v", time.Since(start))
}

// expectHeld maps Unreleased names to held's descriptions.
func expectHeld(unreleased []string) []string {
	m := map[string]string{"lease": "lease", "admission": "admission", "workspace": "workspace", "runtime": "runtime", "location": "route"}
	var out []string
	for _, u := range unreleased {
		out = append(out, m[u])
	}
	return out
}

func sameKinds(got, want []string) bool {
	kinds := make([]string, 0, len(got))
	for _, g := range got {
		kinds = append(kinds, strings.Fields(g)[0])
	}
	w := slices.Clone(want)
	sort.Strings(kinds)
	sort.Strings(w)
	return slices.Equal(kinds, w)
}

// cleanUp removes what a failing compensation left, so cases stay apart.
func cleanUp(t *testing.T, h *host, ct *ctrdEnv, key Key) {
	t.Helper()
	ctx := testCtx(t)
	for _, w := range ct.workloads(t) {
		if strings.Contains(w, "-"+key.Session+"-") {
			if err := ct.rt.Remove(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := h.ws.ReleaseWorkspace(ctx, key); err != nil {
		t.Fatal(err)
	}
	h.ledger.Release(key)
}
