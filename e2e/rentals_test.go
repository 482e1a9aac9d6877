package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/fake"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// localMachine is an agent started in-process for a rental, on its own
// containerd, enrolling with the bootstrap it was handed.
type localMachine struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (m *localMachine) Stop(context.Context) error { m.cancel(); <-m.done; return nil }
func (m *localMachine) Done() <-chan struct{}      { return m.done }

// localLauncher rents "machines" on this host: each gets a fresh containerd
// and an agent that knows nothing but its bootstrap.
func (f *fleet) localLauncher(t *testing.T) local.Launcher { return f.localLauncherWith(t, nil) }

// localLauncherWith is localLauncher with configure changing each
// machine's agent configuration (dir is the machine's data dir).
func (f *fleet) localLauncherWith(t *testing.T, configure func(name, dir string, c *agent.Config)) local.Launcher {
	var mu sync.Mutex
	return func(_ context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
		mu.Lock()
		w := newWorld(t)
		dir := tempDir(t)
		mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		rt, err := containerd.New(ctx, w.runtimeOptions(dir, f.log.Named(name)))
		if err != nil {
			cancel()
			return nil, err
		}
		conn, err := bus.Connect(boot.ControlPlaneURL, name, f.log.Named(name))
		if err != nil {
			cancel()
			return nil, err
		}
		cfg := agent.Config{NodeID: boot.NodeID, RentalID: boot.RentalID, Generation: boot.Generation, EnrollmentToken: boot.EnrollmentToken,
			DataDir: dir, StopGrace: time.Second}
		if configure != nil {
			configure(name, dir, &cfg)
		}
		a, err := agent.New(cfg, conn, rt, f.log.Named(name))
		if err != nil {
			cancel()
			return nil, err
		}
		m := &localMachine{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(m.done)
			defer func() { conn.Close(); _ = rt.Close() }()
			_ = a.Run(ctx)
		}()
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		return m, nil
	}
}

func (f *fleet) rentals() []schemas.Rental {
	f.t.Helper()
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketRentals)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []schemas.Rental
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	for k := range keys.Keys() {
		var r schemas.Rental
		if _, err := bus.GetJSON(context.Background(), kv, k, &r); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// TestAcceptance_ProvisionEnrollRun: with the local provider and no nodes, a
// Run rents a machine, its agent enrolls from the bootstrap, the Run
// finishes there; a second Run reuses the warm rental; the idle rental is
// then retired.
func TestAcceptance_ProvisionEnrollRun(t *testing.T) {
	w := newWorld(t) // for the image reference only
	var f *fleet
	var provider *local.Provider
	f = newFleet(t, invitedOnly, func(c *controlplane.Config) {
		provider = local.New(func(ctx context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
			return f.localLauncher(t)(ctx, name, boot)
		}, capacity.Offer{ID: "local-2c", CPUMillis: 2000, MemoryBytes: 4 << 30, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 50_000, Exact: true}})
		c.Capacity = &rentals.Config{Provider: provider, OwnershipToken: "wf-e2e", IdleTimeout: 3 * time.Second, Interval: 200 * time.Millisecond}
	})

	first := f.submit(schemas.RunRequest{RequestID: "rent-1", Image: w.image.Reference, Command: []string{"sh", "-c", "exit 0"}})
	r1 := f.waitPhase(first, schemas.PhaseSucceeded, 90*time.Second)
	rentals := f.rentals()
	if len(rentals) != 1 || rentals[0].NodeID != r1.NodeID || rentals[0].ForRun != first {
		t.Fatalf("rentals %+v; run ran on %s", rentals, r1.NodeID)
	}
	rt := rentals[0]
	// The Run's log shows what it waited for: the rental, by id and stage.
	var waits []string
	for _, ev := range f.events(first) {
		if ev.Decided() && ev.Code == schemas.CodeNoCapacity {
			waits = append(waits, ev.Message)
		}
	}
	if len(waits) == 0 || !strings.Contains(strings.Join(waits, "\n"), "rental "+rt.RentalID+" is ") {
		t.Errorf("waiting events %q do not name rental %s and its stage", waits, rt.RentalID)
	}
	if boot, ok := provider.Bootstrap(rt.NativeRef); !ok || boot.NodeID != rt.NodeID || boot.RentalID != rt.RentalID || boot.EnrollmentToken == "" {
		t.Fatalf("bootstrap delivered: %+v", boot)
	}
	second := f.submit(schemas.RunRequest{RequestID: "rent-2", Image: w.image.Reference, Command: []string{"true"}})
	r2 := f.waitPhase(second, schemas.PhaseSucceeded, 60*time.Second)
	if r2.NodeID != r1.NodeID || provider.Launched() != 1 {
		t.Fatalf("second run on %s after %d rentals; want reuse of %s", r2.NodeID, provider.Launched(), r1.NodeID)
	}
	// Idle past IdleTimeout: local machines cannot stop and resume, so the
	// rental is terminated, and its stages are all recorded.
	f.eventually(30*time.Second, "the idle rental to be terminated", func() bool {
		rs := f.rentals()
		return len(rs) == 1 && rs[0].State == schemas.RentalTerminated
	})
	var seen []schemas.RentalState
	for _, s := range f.rentals()[0].Stages {
		seen = append(seen, s.State)
	}
	for _, want := range []schemas.RentalState{schemas.RentalRequested, schemas.RentalEnrolling, schemas.RentalReady, schemas.RentalTerminating, schemas.RentalTerminated} {
		found := false
		for _, s := range seen {
			found = found || s == want
		}
		if !found {
			t.Errorf("rental stages %v lack %s", seen, want)
		}
	}
	if rec := f.nodeRecord(r1.NodeID); rec.State != schemas.NodeDraining && rec.State != schemas.NodeLost {
		t.Errorf("retired rental's node is %s", rec.State)
	}
}

// TestAcceptance_LostProvisionResponse: the fake provider accepts a
// provision but the answer is lost; a restarted control plane finds the
// machine by listing owned capacity and adopts it, with no second
// allocation. A machine that merely resembles ours is never touched, and one
// of ours that belongs to no rental is terminated by the janitor.
func TestAcceptance_LostProvisionResponse(t *testing.T) {
	clock := fake.NewManualClock(time.Now())
	sup := fake.DefaultSupport()
	sup.IdempotentProvision = capacity.IdempotencyNone // force list-owned reconciliation
	p, err := fake.New(fake.Config{Seed: 7, Clock: clock, Support: &sup, Faults: fake.Faults{LostResponse: 1}})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	f := newFleet(t, func(c *controlplane.Config) {
		c.Capacity = &rentals.Config{Provider: p, OwnershipToken: "wf-e2e", LostAnswerAfter: time.Second, Interval: 200 * time.Millisecond, JanitorInterval: time.Second}
	})
	id := f.submit(schemas.RunRequest{RequestID: "lost-answer", Image: w.image.Reference, Command: []string{"true"}})
	var rt schemas.Rental
	f.eventually(30*time.Second, "a rental whose answer was lost", func() bool {
		rs := f.rentals()
		if len(rs) == 1 {
			rt = rs[0]
		}
		return len(rs) == 1 && rt.State == schemas.RentalProvisioning && rt.LastError != ""
	})
	if rt.NativeRef != "" {
		t.Fatalf("the answer was not lost: %+v", rt)
	}
	// Restart the control plane; answers are delivered again from now on.
	f.cp.stop(t)
	p.SetFaults(fake.Faults{})
	foreign := p.PlantForeign(rt.RentalID, "someone-else")
	f.cp = f.startCP()
	f.eventually(30*time.Second, "the lost machine to be adopted", func() bool {
		rs := f.rentals()
		return len(rs) == 1 && rs[0].NativeRef != ""
	})
	if n := p.AllocationCount(rt.RentalID); n != 1 {
		t.Fatalf("%d allocations for rental %s; want exactly one", n, rt.RentalID)
	}
	if got := f.rentals()[0]; got.NativeRef == foreign {
		t.Fatalf("adopted a look-alike that is not ours")
	}
	if obs, err := p.ObserveCapacity(context.Background(), capacity.Ref{NativeRef: foreign, OwnershipToken: "someone-else"}); err != nil || obs.State.Gone() {
		t.Fatalf("the look-alike was touched: %v %+v", err, obs)
	}
	_ = id
}

// TestAcceptance_JanitorTerminatesOrphans: a machine carrying our ownership
// token that belongs to no rental (a crash between allocation and record,
// an operator's stray) is terminated; a look-alike with another token is
// left alone.
func TestAcceptance_JanitorTerminatesOrphans(t *testing.T) {
	p, err := fake.New(fake.Config{Seed: 11, Clock: fake.NewManualClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	offers, err := p.ListCapacity(context.Background(), capacity.OfferQuery{})
	if err != nil || len(offers) == 0 {
		t.Fatalf("offers: %v", err)
	}
	rc, err := p.ProvisionCapacity(context.Background(), capacity.ProvisionCommand{OperationKey: "stray-g1", RentalID: "rt-stray", Generation: 1,
		OwnershipToken: "wf-e2e", OfferID: offers[0].ID})
	if err != nil {
		t.Fatal(err)
	}
	foreign := p.PlantForeign("rt-stray", "someone-else")
	f := newFleet(t, func(c *controlplane.Config) {
		c.Capacity = &rentals.Config{Provider: p, OwnershipToken: "wf-e2e", JanitorInterval: 200 * time.Millisecond, Interval: 200 * time.Millisecond}
	})
	f.eventually(20*time.Second, "the orphan to be terminated", func() bool {
		obs, err := p.ObserveCapacity(context.Background(), capacity.Ref{NativeRef: rc.NativeRef, OwnershipToken: "wf-e2e"})
		return err == nil && (obs.State == capacity.StateTerminating || obs.State == capacity.StateTerminated)
	})
	if obs, err := p.ObserveCapacity(context.Background(), capacity.Ref{NativeRef: foreign, OwnershipToken: "someone-else"}); err != nil || obs.State == capacity.StateTerminating || obs.State.Gone() {
		t.Fatalf("the look-alike was touched: %v %+v", err, obs)
	}
}
