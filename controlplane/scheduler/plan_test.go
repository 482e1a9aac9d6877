package scheduler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/controlplane/queue"
	"github.com/warmfleet/warmfleet/schemas"
)

// world is a scheduler over an in-memory cache, without NATS: its plans
// are applied to its Runs here, as the pass would write them.
type world struct {
	t    *testing.T
	s    *Scheduler
	now  time.Time
	runs []*schemas.Run
	memo *queue.Memo
	seq  int
}

func newWorld(t *testing.T, pol schemas.SchedulingPolicy) *world {
	w := &world{t: t, now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC), memo: queue.NewMemo()}
	w.s = New(Config{Placement: placement.DefaultConfig(), Now: func() time.Time { return w.now }, Policy: policy.Static(pol, "v1")},
		cache.New(), nil, nil, nil, nil, zap.NewNop())
	return w
}

// node enrolls a ready node offering cpu millicores, holding images.
func (w *world) node(id string, cpu int64, images ...schemas.ImageLocality) {
	w.s.cache.NoteNode(schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, Generation: 1,
		Capacity: schemas.Resources{CPUMillis: cpu, MemoryBytes: 1 << 30}, LeaseExpires: w.now.Add(time.Hour), FactsReceivedAt: w.now,
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64"}, Images: images}}, 1)
}

// submit adds a waiting Run of tenant; prio names its class.
func (w *world) submit(tenant string, cpu int64, prio string) *schemas.Run {
	w.seq++
	r := &schemas.Run{ID: fmt.Sprintf("r-%03d", w.seq), Tenant: tenant, Phase: schemas.PhaseAccepted, CreatedAt: w.now.Add(time.Duration(w.seq) * time.Second),
		Request: schemas.RunRequest{Image: image, Resources: schemas.Resources{CPUMillis: cpu}, Priority: prio, MaxRuntimeSeconds: 600}}
	w.runs = append(w.runs, r)
	return r
}

// hold books a Run of tenant on node: running since age ago, or queued.
func (w *world) hold(tenant, node string, cpu int64, queued bool, age time.Duration) *schemas.Run {
	r := w.submit(tenant, cpu, "")
	start := w.now.Add(-age)
	r.Phase, r.NodeID, r.Queued, r.Attempt, r.PhaseSince = schemas.PhaseRunning, node, queued, 1, start
	if !queued {
		r.StartedAt = &start
	}
	return r
}

// plan plans a pass over the world and applies it.
func (w *world) plan() queue.Result {
	var booked, waiting []*schemas.Run
	for _, r := range w.runs {
		if r.Phase == schemas.PhaseAccepted {
			waiting = append(waiting, r)
		} else {
			booked = append(booked, r)
		}
	}
	res := w.s.plan(w.s.policy(), booked, waiting, w.s.snapshot(w.runs, w.now), w.now, w.memo)
	for _, a := range res.Actions {
		switch a.Kind {
		case queue.KindPlace:
			a.Run.Phase, a.Run.NodeID, a.Run.Queued, a.Run.PhaseSince, a.Run.Waiting = schemas.PhasePlaced, a.Decision.Winner, a.Decision.WinnerQueued, w.now, ""
		case queue.KindWait:
			a.Run.Waiting = "waiting: " + string(a.Code)
		}
	}
	return res
}

func placedIDs(res queue.Result) []string {
	var ids []string
	for _, a := range res.Actions {
		if a.Kind == queue.KindPlace {
			ids = append(ids, a.Run.ID)
		}
	}
	return ids
}

// The pass serves the higher priority class first, then the tenant with
// the lowest weighted dominant share (recomputed as each Run books), then
// the oldest Run.
func TestPassOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		weightA float64
		want    []string
	}{
		{"equal weights: shares tie, the older Run first", 1, []string{"u", "a1", "b1", "a2", "b2"}},
		{"tenant a weighs double", 2, []string{"u", "a1", "a2", "b1", "b2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, schemas.SchedulingPolicy{DefaultPriority: "batch",
				PriorityClasses: []schemas.PriorityClass{{Name: "urgent", Value: 100}, {Name: "batch", Value: 0}},
				Tenants:         map[string]schemas.TenantPolicy{"a": {Weight: tc.weightA}}})
			w.node("n1", 10000)
			w.hold("a", "n1", 1000, false, time.Minute)
			w.hold("a", "n1", 1000, false, time.Minute)
			w.hold("b", "n1", 1000, false, time.Minute)
			names := map[string]string{}
			for _, s := range []struct{ name, tenant, prio string }{{"a1", "a", ""}, {"b1", "b", ""}, {"a2", "a", ""}, {"b2", "b", ""}, {"u", "b", "urgent"}} {
				names[w.submit(s.tenant, 1000, s.prio).ID] = s.name
			}
			var got []string
			for _, id := range placedIDs(w.plan()) {
				got = append(got, names[id])
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("served %v, want %v", got, tc.want)
			}
		})
	}
}

// A pass re-decides a waiting Run only when what it depends on changed:
// a second pass over an unchanged fleet decides nothing; a node freeing
// re-decides the shape that could use it and not the shape it is too
// small for; and once a shape finds no node, the rest of it is not
// decided in that pass.
func TestPassRedecidesOnlyWhatChanged(t *testing.T) {
	w := newWorld(t, schemas.SchedulingPolicy{})
	w.node("n1", 1000)
	w.node("n2", 4000)
	freeing := w.hold("x", "n1", 1000, false, time.Minute)
	w.hold("x", "n2", 4000, false, time.Minute)
	for range 4 { // full queues: no node can take or queue anything
		w.hold("x", "n1", 1000, true, 0)
		w.hold("x", "n2", 4000, true, 0)
	}
	small, big := map[string]bool{}, map[string]bool{}
	for range 3 {
		small[w.submit("y", 1000, "").ID] = true
		big[w.submit("y", 4000, "").ID] = true
	}
	if res := w.plan(); res.Decisions != 2 || res.Skipped != 4 || len(res.Actions) != 6 {
		t.Fatalf("first pass: %d decisions, %d skipped, %d actions; want 2 (one per shape), 4, a wait for each of 6", res.Decisions, res.Skipped, len(res.Actions))
	}
	if res := w.plan(); res.Decisions != 0 || len(res.Actions) != 0 {
		t.Fatalf("a pass over an unchanged fleet: %d decisions, %+v", res.Decisions, res.Actions)
	}
	w.runs = slices.DeleteFunc(w.runs, func(r *schemas.Run) bool { return r == freeing })
	res := w.plan()
	if res.Decisions != 1 || len(res.Actions) != 1 || !small[res.Actions[0].Run.ID] {
		t.Fatalf("after n1 freed: %d decisions, actions %+v; want one decision, of a Run n1 fits", res.Decisions, res.Actions)
	}
}

// Whether a Run waits for a warm node or starts cold elsewhere is decided
// on when it would start: a warm node that frees sooner than the image
// pulls onto a cold one is worth its queue; one that frees later is not.
func TestPassWaitOrStartCold(t *testing.T) {
	ref, err := schemas.ParseImageRef("image", image)
	if err != nil {
		t.Fatal(err)
	}
	hot := schemas.ImageLocality{ManifestDigest: ref.Digest, State: schemas.LocalityHot, ContentPresent: true,
		LayerDigests: []string{"sha256:" + fmt.Sprintf("%064x", 1)}, LayerSizes: []int64{10e9}, // 100 s to pull at placement's default
		Platform: schemas.Platform{OS: "linux", Architecture: "amd64"}}
	for _, tc := range []struct {
		name   string
		frees  time.Duration
		winner string
		queued bool
	}{
		{"the warm node frees in 10s", 10 * time.Second, "warm", true},
		{"the warm node frees in 500s", 500 * time.Second, "cold", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, schemas.SchedulingPolicy{})
			w.node("warm", 1000, hot)
			w.node("cold", 1000)
			w.hold("x", "warm", 1000, false, 600*time.Second-tc.frees) // max runtime 600 s
			r := w.submit("y", 1000, "")
			res := w.plan()
			if got := placedIDs(res); len(got) != 1 || got[0] != r.ID {
				t.Fatalf("placed %v", got)
			}
			if d := res.Actions[0].Decision; d.Winner != tc.winner || d.WinnerQueued != tc.queued {
				t.Errorf("winner %s (queued %v), want %s (queued %v)", d.Winner, d.WinnerQueued, tc.winner, tc.queued)
			}
		})
	}
}

// Intake leaves every Run to the pass under a policy with classes,
// quotas or budgets.
func TestPlainPolicy(t *testing.T) {
	n := int64(1)
	for _, tc := range []struct {
		pol  schemas.SchedulingPolicy
		want bool
	}{
		{schemas.SchedulingPolicy{}, true},
		{schemas.SchedulingPolicy{GPUHourPrice: 2, Tenants: map[string]schemas.TenantPolicy{"a": {Weight: 2}}}, true},
		{schemas.SchedulingPolicy{PriorityClasses: []schemas.PriorityClass{{Name: "x"}}}, false},
		{schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"a": {Quota: &schemas.Quota{Runs: &n}}}}, false},
		{schemas.SchedulingPolicy{Default: schemas.TenantPolicy{Budget: &schemas.Budget{AmountUSD: 1, Period: "day"}}}, false},
	} {
		if got := plainPolicy(policy.Static(tc.pol, "")); got != tc.want {
			t.Errorf("plainPolicy(%+v) = %v", tc.pol, got)
		}
	}
}

// A retry's decision penalises every node an earlier attempt failed on;
// preempted and successful attempts are no failure.
func TestPenalties(t *testing.T) {
	got := penalties([]schemas.AttemptRecord{{Attempt: 1, NodeID: "n1", Outcome: schemas.CodeOOMKilled}, {Attempt: 2, NodeID: "n2", Outcome: schemas.CodePreempted},
		{Attempt: 3, NodeID: "n3", Outcome: "succeeded"}, {Attempt: 4, NodeID: "n4"}})
	if len(got) != 1 || got["n1"] != "attempt 1 failed here: "+string(schemas.CodeOOMKilled) {
		t.Errorf("penalties %v", got)
	}
}
