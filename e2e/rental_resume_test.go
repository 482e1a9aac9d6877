package e2e

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// suspendableMachine is a local rental whose agent can be stopped keeping
// its data dir (saved session, journal) and its containerd (images), and
// started again from them with the bootstrap it was first given — what a
// cloud machine's stop and start are.
type suspendableMachine struct {
	f    *fleet
	name string
	boot schemas.NodeBootstrap
	w    world
	dir  string

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	starts  int
	stopped bool // terminated: nothing may start again
}

func (m *suspendableMachine) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return errors.New("machine terminated")
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt, err := containerd.New(ctx, m.w.runtimeOptions(m.dir, m.f.log.Named(m.name)))
	if err != nil {
		cancel()
		return err
	}
	conn, err := bus.Connect(m.boot.ControlPlaneURL, m.name, m.f.log.Named(m.name))
	if err != nil {
		cancel()
		_ = rt.Close()
		return err
	}
	a, err := agent.New(agent.Config{NodeID: m.boot.NodeID, RentalID: m.boot.RentalID, Generation: m.boot.Generation,
		EnrollmentToken: m.boot.EnrollmentToken, DataDir: m.dir, StopGrace: time.Second}, conn, rt, m.f.log.Named(m.name))
	if err != nil {
		cancel()
		conn.Close()
		_ = rt.Close()
		return err
	}
	done := make(chan struct{})
	m.cancel, m.done = cancel, done
	m.starts++
	go func() {
		defer close(done)
		defer func() { conn.Close(); _ = rt.Close() }()
		if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			m.f.log.Named(m.name).Info("agent ended: " + err.Error())
		}
	}()
	return nil
}

// halt ends the agent process, if one runs, and waits for it.
func (m *suspendableMachine) halt() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (m *suspendableMachine) Suspend(context.Context) error { m.halt(); return nil }
func (m *suspendableMachine) Resume(context.Context) error  { return m.start() }

func (m *suspendableMachine) Stop(context.Context) error {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.halt()
	return os.RemoveAll(m.dir)
}

func (m *suspendableMachine) Done() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done
}

func (m *suspendableMachine) Starts() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.starts
}

// TestAcceptance_RentalResume: a rental retired idle by a provider that
// stops, resumes and keeps the disk is stopped, not terminated; a later Run
// resumes it instead of provisioning (one machine ever launched). Each
// resume is a new lifecycle cycle: the rental's generation rises, the
// machine's agent comes back with its saved session — expired while it was
// stopped — and the control plane moves its node to the new generation
// under a higher fencing token. Two cycles run, so the second resume starts
// from a session saved under a later generation than the agent's bootstrap.
func TestAcceptance_RentalResume(t *testing.T) {
	w := newWorld(t)
	var f *fleet
	var mu sync.Mutex
	var machines []*suspendableMachine
	provider := local.New(func(_ context.Context, name string, boot schemas.NodeBootstrap) (local.Machine, error) {
		m := &suspendableMachine{f: f, name: name, boot: boot, w: w, dir: tempDir(t)}
		if err := m.start(); err != nil {
			return nil, err
		}
		mu.Lock()
		machines = append(machines, m)
		mu.Unlock()
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		return m, nil
	}, capacity.Offer{ID: "local-2c", CPUMillis: 2000, MemoryBytes: 4 << 30, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 50_000, Exact: true}},
		local.WithStopResume())
	const sessionTTL = 3 * time.Second
	f = newFleet(t, invitedOnly, func(c *controlplane.Config) {
		c.SessionTTL = sessionTTL
		c.Capacity = &rentals.Config{Provider: provider, OwnershipToken: "wf-e2e", IdleTimeout: 2 * time.Second, Interval: 200 * time.Millisecond}
	})

	first := f.submit(schemas.RunRequest{RequestID: "resume-1", Image: w.image.Reference, Command: []string{"sh", "-c", "exit 0"}})
	r1 := f.waitPhase(first, schemas.PhaseSucceeded, 90*time.Second)
	var fencing uint64
	for cycle, id := range []string{"resume-2", "resume-3"} {
		wantGen := uint64(cycle + 2)
		var rt schemas.Rental
		f.eventually(30*time.Second, "the idle rental to be stopped", func() bool {
			rs := f.rentals()
			if len(rs) == 1 {
				rt = rs[0]
			}
			return len(rs) == 1 && rt.State == schemas.RentalStopped
		})
		mu.Lock()
		m := machines[0]
		mu.Unlock()
		select {
		case <-m.Done():
		default:
			t.Fatal("the stopped rental's agent still runs")
		}
		rec := f.nodeRecord(r1.NodeID)
		if rec.Generation != wantGen-1 || rec.FencingToken < fencing || rec.FencingToken == 0 {
			t.Fatalf("cycle %d: node before resume %+v", cycle, rec)
		}
		fencing = rec.FencingToken
		// Let the session lapse while the machine is stopped, as it would
		// over a night.
		time.Sleep(time.Until(rec.SessionExpires) + 200*time.Millisecond)

		run := f.submit(schemas.RunRequest{RequestID: id, Image: w.image.Reference, Command: []string{"true"}})
		r := f.waitPhase(run, schemas.PhaseSucceeded, 60*time.Second)
		if r.NodeID != r1.NodeID || provider.Launched() != 1 {
			t.Fatalf("cycle %d: run on %s after %d provisions; want the resumed %s and one provision", cycle, r.NodeID, provider.Launched(), r1.NodeID)
		}
		if got := m.Starts(); got != cycle+2 {
			t.Fatalf("cycle %d: agent started %d times", cycle, got)
		}
		rt = f.rentals()[0]
		if rt.Generation != wantGen || rt.ForRun != run {
			t.Fatalf("cycle %d: rental after resume %+v", cycle, rt)
		}
		rec = f.nodeRecord(r1.NodeID)
		if rec.Generation != wantGen || rec.FencingToken <= fencing || r.Generation != wantGen {
			t.Fatalf("cycle %d: node after resume gen %d token %d (before %d); run booked under gen %d", cycle, rec.Generation, rec.FencingToken, fencing, r.Generation)
		}
		fencing = rec.FencingToken
		// The rental is ready again once the pass after the enrollment sees
		// it (the Run may finish sooner).
		f.eventually(10*time.Second, "the resumed rental to be ready", func() bool {
			var seen []schemas.RentalState
			for _, s := range f.rentals()[0].Stages {
				seen = append(seen, s.State)
			}
			tail := seen
			for j := 0; j <= cycle; j++ { // past this cycle's stop
				k := slices.Index(tail, schemas.RentalStopped)
				if k < 0 {
					return false
				}
				tail = tail[k+1:]
			}
			return slices.Contains(tail, schemas.RentalBooting) && slices.Contains(tail, schemas.RentalReady)
		})
	}
	for _, rt := range f.rentals() {
		for _, s := range rt.Stages {
			if s.At.IsZero() || s.Source == "" || s.Bound != (s.Source == schemas.StageObserved) {
				t.Errorf("stage %s: time %v from %q (bound %v)", s.State, s.At, s.Source, s.Bound)
			}
		}
	}
}
