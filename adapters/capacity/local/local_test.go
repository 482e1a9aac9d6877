package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/conformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/schemas"
)

// process stands in for an agent process: the conformance suite checks the
// provider's contract, not the agent (e2e does that with real agents).
type process struct {
	once sync.Once
	done chan struct{}
}

func (p *process) Stop(context.Context) error { p.once.Do(func() { close(p.done) }); return nil }
func (p *process) Done() <-chan struct{}      { return p.done }

// suspendable is a process that can be stopped keeping its disk and
// started again: a new done channel per start, a disk that survives.
type suspendable struct {
	mu      sync.Mutex
	running *process
	disk    []string // what the "agent" wrote; kept across suspend
	gone    bool
}

func (s *suspendable) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone, s.disk = true, nil
	return s.running.Stop(ctx)
}

func (s *suspendable) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running.done
}

func (s *suspendable) Suspend(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disk = append(s.disk, "suspended")
	return s.running.Stop(ctx)
}

func (s *suspendable) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return errors.New("resume of a terminated machine")
	}
	s.running = &process{done: make(chan struct{})}
	s.disk = append(s.disk, "resumed")
	return nil
}

func newProvider(t *testing.T) capacity.Provider { return newProviderWith(t) }

func newProviderWith(_ *testing.T, opts ...local.Option) capacity.Provider {
	return local.New(func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) {
		return &process{done: make(chan struct{})}, nil
	}, localOffer, opts...)
}

var localOffer = capacity.Offer{ID: "local", CPUMillis: 2000, MemoryBytes: 1 << 30, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 100_000, Exact: true}}

func newResumable(t *testing.T) capacity.Provider {
	return local.New(func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) {
		return &suspendable{running: &process{done: make(chan struct{})}}, nil
	}, localOffer, local.WithStopResume())
}

func received(t *testing.T, p capacity.Provider, ref string) ([]byte, bool) {
	b, ok := p.(*local.Provider).Bootstrap(ref)
	if !ok {
		return nil, false
	}
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return data, true
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newProvider, conformance.Options{Received: received})
}

// TestConformance_Spot runs the suite against a provider with a spot
// offer, which Interrupt takes back.
func TestConformance_Spot(t *testing.T) {
	conformance.Run(t, func(t *testing.T) capacity.Provider {
		return newProviderWith(t, local.WithSpotOffer(capacity.Offer{ID: "local-spot", CPUMillis: 1000, MemoryBytes: 1 << 30,
			PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 1000}}))
	}, conformance.Options{Received: received, Interrupt: func(t *testing.T, p capacity.Provider, ref string) {
		if err := p.(*local.Provider).Interrupt(context.Background(), ref); err != nil {
			t.Fatal(err)
		}
	}})
}

// TestConformance_StopResume runs the suite against local machines that
// stop keeping their data dir and start again from it.
func TestConformance_StopResume(t *testing.T) {
	conformance.Run(t, newResumable, conformance.Options{Received: received})
}

// TestStopResume_KeepsDiskAndFences: a stopped machine's agent is not
// running and its disk is kept; a start under an older generation than the
// stop's is refused; start brings a new process up on the same disk, and a
// machine whose new process exits is reported failed.
func TestStopResume_KeepsDiskAndFences(t *testing.T) {
	var mach *suspendable
	p := local.New(func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) {
		mach = &suspendable{running: &process{done: make(chan struct{})}}
		return mach, nil
	}, localOffer, local.WithStopResume())
	ctx := context.Background()
	if s := p.Support(); !s.Stop || !s.Resume || !s.PersistentDisk || s.Validate() != nil {
		t.Fatalf("support %+v", s)
	}
	rc, err := p.ProvisionCapacity(ctx, capacity.ProvisionCommand{OperationKey: "rt-1-g1", RentalID: "rt-1", Generation: 1, OwnershipToken: "wf", OfferID: "local"})
	if err != nil {
		t.Fatal(err)
	}
	ref := capacity.Ref{RentalID: "rt-1", NativeRef: rc.NativeRef, OwnershipToken: "wf"}
	first := mach.Done()
	if _, err := p.StopCapacity(ctx, capacity.Command{Ref: ref, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	default:
		t.Fatal("the agent still runs on a stopped machine")
	}
	if obs, _ := p.ObserveCapacity(ctx, ref); obs.State != capacity.StateStopped || obs.StateSince.IsZero() {
		t.Fatalf("after stop: %+v", obs)
	}
	if _, err := p.StartCapacity(ctx, capacity.Command{Ref: ref, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StopCapacity(ctx, capacity.Command{Ref: ref, Generation: 1}); !errors.Is(err, capacity.ErrStaleGeneration) {
		t.Fatalf("stop under a superseded generation: %v", err)
	}
	if obs, _ := p.ObserveCapacity(ctx, ref); obs.State != capacity.StateRunning {
		t.Fatalf("after start: %+v", obs)
	}
	if got := mach.disk; len(got) != 2 || got[0] != "suspended" || got[1] != "resumed" {
		t.Fatalf("disk across stop and start: %v", got)
	}
	owned, err := p.ListOwnedCapacity(ctx, capacity.OwnershipQuery{OwnershipToken: "wf"})
	if err != nil || len(owned) != 1 || owned[0].Generation != 2 {
		t.Fatalf("owned after a resume: %+v %v", owned, err)
	}
	_ = mach.Stop(ctx) // the resumed process dies on its own
	if obs, _ := p.ObserveCapacity(ctx, ref); obs.State != capacity.StateFailed {
		t.Fatalf("a machine whose resumed agent exited: %+v", obs)
	}
}

// TestStopResume_RefusesPlainMachines: a provider that declares stop and
// resume refuses a launcher whose machines cannot suspend, and stops what it
// launched.
func TestStopResume_RefusesPlainMachines(t *testing.T) {
	proc := &process{done: make(chan struct{})}
	p := local.New(func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) { return proc, nil }, localOffer, local.WithStopResume())
	_, err := p.ProvisionCapacity(context.Background(), capacity.ProvisionCommand{OperationKey: "rt-1-g1", RentalID: "rt-1", Generation: 1, OwnershipToken: "wf", OfferID: "local"})
	if err == nil {
		t.Fatal("provisioned a machine that cannot suspend under a stop/resume declaration")
	}
	select {
	case <-proc.done:
	default:
		t.Fatal("the launched machine was left running")
	}
}

// TestShutdown_StopsEveryMachine: a provider's machines do not outlive it,
// and a second provider (a restarted control plane) neither reuses the
// first one's refs nor claims its machines.
func TestShutdown_StopsEveryMachine(t *testing.T) {
	var procs []*process
	launch := func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) {
		p := &process{done: make(chan struct{})}
		procs = append(procs, p)
		return p, nil
	}
	ctx := context.Background()
	first := local.New(launch, localOffer)
	var refs []string
	for i, rental := range []string{"rt-1", "rt-2"} {
		rc, err := first.ProvisionCapacity(ctx, capacity.ProvisionCommand{OperationKey: rental + "-g1", RentalID: rental, Generation: 1, OwnershipToken: "wf", OfferID: "local"})
		if err != nil {
			t.Fatal(i, err)
		}
		refs = append(refs, rc.NativeRef)
	}
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs {
		select {
		case <-p.done:
		default:
			t.Fatalf("machine %d still runs after Shutdown", i)
		}
	}
	second := local.New(launch, localOffer)
	rc, err := second.ProvisionCapacity(ctx, capacity.ProvisionCommand{OperationKey: "rt-3-g1", RentalID: "rt-3", Generation: 1, OwnershipToken: "wf", OfferID: "local"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r == rc.NativeRef {
			t.Fatalf("a new provider reused ref %s", r)
		}
		if _, err := second.ObserveCapacity(ctx, capacity.Ref{NativeRef: r, OwnershipToken: "wf"}); !errors.Is(err, capacity.ErrNotFound) {
			t.Fatalf("a new provider observes its predecessor's %s: %v", r, err)
		}
	}
}
