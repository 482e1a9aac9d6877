package queue

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

const digest = "sha256:a172cedcae47474b615c54d510a5d84a8dea3032e958587430b413538be3f333"

// sim is a fleet and its Runs in memory, passes planned over them and
// applied the way the scheduler applies them (placed Runs start at once
// or queue; a preemption marks its victims stopping).
type sim struct {
	t         testing.TB
	now       time.Time
	nodes     []schemas.NodeRecord
	runs      map[string]*schemas.Run
	pol       *policy.Snapshot
	memo      *Memo
	cfg       placement.Config
	budget    func(string) (bool, string)
	seq       int
	order     []*schemas.Run // every Run submitted, oldest first
	decisions int
	planTime  time.Duration // in planOnly: the fleet snapshot and the plan
	last      Result
}

func newSim(t testing.TB, pol schemas.SchedulingPolicy) *sim {
	cfg := placement.DefaultConfig()
	cfg.FactsMaxAge = 1000 * time.Hour
	return &sim{t: t, now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC), runs: map[string]*schemas.Run{},
		pol: policy.Static(pol, "v1"), memo: NewMemo(), cfg: cfg}
}

// node enrolls a ready node with cpu millicores and gpus cards of model.
func (s *sim) node(id string, cpu int64, gpus int, model string) {
	acc := schemas.AcceleratorFacts{}
	if gpus > 0 {
		acc = schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
			Devices: []schemas.AcceleratorDevice{{Model: model, MemoryBytes: 80 << 30, Count: int64(gpus)}}}
		for j := range gpus {
			acc.Cards = append(acc.Cards, schemas.GPUCard{Index: j, UUID: fmt.Sprintf("GPU-%s-%d", id, j), Model: model, MemoryBytes: 80 << 30,
				Health: schemas.GPUHealthOK, CDIDevices: []string{fmt.Sprintf("nvidia.com/gpu=%d", j)}})
		}
	}
	s.nodes = append(s.nodes, schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, Generation: 1,
		Capacity: schemas.Resources{CPUMillis: cpu, MemoryBytes: 64 << 30, GPUCount: int64(gpus)}, LeaseExpires: s.now.Add(1000 * time.Hour),
		FactsReceivedAt: s.now, Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: "amd64", Accelerator: acc}}})
}

// submit adds a waiting Run of tenant; mod adjusts its request.
func (s *sim) submit(tenant string, cpu, gpus int64, mod ...func(*schemas.RunRequest)) *schemas.Run {
	s.seq++
	req := schemas.RunRequest{Image: "registry.example/app@" + digest, Resources: schemas.Resources{CPUMillis: cpu, GPUCount: gpus}, MaxRuntimeSeconds: 600}
	for _, m := range mod {
		m(&req)
	}
	r := &schemas.Run{ID: fmt.Sprintf("r-%05d", s.seq), Tenant: tenant, Request: req, Phase: schemas.PhaseAccepted,
		CreatedAt: s.now.Add(time.Duration(s.seq) * time.Millisecond), PhaseSince: s.now}
	s.runs[r.ID] = r
	s.order = append(s.order, r)
	return r
}

// sorted lists the Runs oldest first (submitted in that order).
func (s *sim) sorted() []*schemas.Run {
	s.order = slices.DeleteFunc(s.order, func(r *schemas.Run) bool { return s.runs[r.ID] != r })
	return slices.Clone(s.order)
}

// fleet is the fleet as the scheduler's snapshot builds it.
func (s *sim) fleet() *placement.Fleet {
	byNode := map[string][]*schemas.Run{}
	for _, r := range s.sorted() {
		if r.Phase != schemas.PhaseAccepted {
			byNode[r.NodeID] = append(byNode[r.NodeID], r)
		}
	}
	nodes := make([]*placement.Node, len(s.nodes))
	for i, rec := range s.nodes {
		n := placement.NewNode(rec)
		for _, r := range byNode[rec.NodeID] {
			b := placement.Booking{RunID: r.ID, Resources: r.Request.Resources, ExpectedEnd: r.PhaseSince.Add(10 * time.Minute), GPUs: r.GPUs, Want: r.Request.GPU}
			if r.Queued {
				n.Queued = append(n.Queued, b)
			} else {
				n.Running = append(n.Running, b)
			}
		}
		nodes[i] = n
	}
	return placement.NewFleet(nodes)
}

// startQueued starts the head of each node's queue that fits now.
func (s *sim) startQueued() {
	f := s.fleet()
	for _, r := range s.sorted() {
		if !r.Queued {
			continue
		}
		n := f.Node(r.NodeID)
		if !n.CanStart(r.ID) {
			continue
		}
		gpus, _, _ := n.PickGPUs(r.Request.Resources.GPUCount, r.Request.GPU)
		r.Queued, r.GPUs, r.PhaseSince = false, gpus, s.now
		f.Start(r.NodeID, r.ID, gpus)
	}
}

// pass plans one pass and applies it.
func (s *sim) pass() Result {
	s.startQueued()
	res := s.planOnly()
	for _, a := range res.Actions {
		s.apply(a)
	}
	return res
}

// planOnly plans a pass over the Runs as they are.
func (s *sim) planOnly() Result {
	var booked, waiting []*schemas.Run
	for _, r := range s.sorted() {
		if r.Phase == schemas.PhaseAccepted {
			waiting = append(waiting, r)
		} else {
			booked = append(booked, r)
		}
	}
	start := time.Now()
	defer func() { s.planTime += time.Since(start) }()
	res := Plan(Input{Now: s.now, Policy: s.pol, Fleet: s.fleet(), Booked: booked, Waiting: waiting, Budget: s.budget, BudgetStops: s.budget,
		Decide: func(r *schemas.Run, f *placement.Fleet) (schemas.BookingDecision, error) {
			return placement.Decide(placement.Request{RunID: r.ID, Attempt: r.Attempt + 1, Run: r.Request, Digest: digest}, f, s.now, s.cfg), nil
		}, UnknownRuntime: 10 * time.Minute}, s.memo)
	s.decisions += res.Decisions
	s.last = res
	return res
}

func (s *sim) apply(a Action) {
	r := s.runs[a.Run.ID]
	switch a.Kind {
	case KindPlace:
		r.Phase, r.NodeID, r.Queued, r.GPUs, r.Waiting, r.WaitCode, r.PhaseSince = schemas.PhasePlaced, a.Decision.Winner, a.Decision.WinnerQueued, a.Decision.GPUs, "", "", s.now
		r.Attempt++
	case KindWait, KindPreempt:
		r.Waiting, r.WaitCode = a.Summary, a.Code
		if a.Code == schemas.CodeNoCapacity {
			r.Waiting = "no node fits"
		}
		for _, v := range a.Victims {
			s.runs[v.RunID].Stopping = schemas.CodePreempted
		}
	case KindBudgetStop:
		r.Stopping = schemas.CodeBudgetExceeded
	}
}

// end ends Run id: a stopping victim goes back to waiting, any other
// leaves.
func (s *sim) end(id string) {
	r := s.runs[id]
	if r.Stopping == schemas.CodePreempted {
		r.Phase, r.NodeID, r.GPUs, r.Queued, r.Stopping, r.Waiting, r.Preemptions = schemas.PhaseAccepted, "", nil, false, "", "", r.Preemptions+1
		return
	}
	delete(s.runs, id)
}

// on lists the Runs booked on node, by id.
func (s *sim) on(node string) []string {
	var ids []string
	for _, r := range s.sorted() {
		if r.NodeID == node && r.Phase != schemas.PhaseAccepted {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func ptr[T any](v T) *T { return &v }
