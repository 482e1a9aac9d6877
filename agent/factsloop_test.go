package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestLaunchGate_AwaitsLaunchesInFlight(t *testing.T) {
	ctx := context.Background()
	g := newLaunchGate()
	awaited := func(limit time.Duration) <-chan bool {
		done := make(chan bool, 1)
		go func() { done <- g.await(ctx, limit) }()
		return done
	}
	select {
	case <-awaited(time.Hour):
	case <-time.After(10 * time.Second):
		t.Fatal("await waited with no launch in flight")
	}

	end1, end2 := g.begin(), g.begin()
	done := awaited(time.Hour)
	end1()
	end1() // an end called twice counts once
	select {
	case <-done:
		t.Fatal("await returned with a launch still in flight")
	case <-time.After(200 * time.Millisecond):
	}
	end2()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("await reported its context ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("await still waiting after the last launch ended")
	}

	g.begin() // a launch that never ends holds a measurement back for limit only
	start := time.Now()
	if ok := <-awaited(100 * time.Millisecond); !ok || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("await past its limit = %v after %s", ok, time.Since(start))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if g.await(cctx, time.Hour) {
		t.Fatal("await with its context ended reported true")
	}
}

// gatedRuntime is a runtime whose Launch blocks until release closes, and
// which records each facts measurement (its Images call).
type gatedRuntime struct {
	stubRuntime
	launching chan struct{} // closed once Launch is entered
	release   chan struct{}
	measured  chan time.Time
}

func (r gatedRuntime) Images(ctx context.Context) ([]schemas.ImageLocality, error) {
	r.measured <- time.Now()
	return r.stubRuntime.Images(ctx)
}

func (r gatedRuntime) EnsureImage(context.Context, noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	return noderuntime.ImageResult{AlreadyPresent: true}, nil
}

func (r gatedRuntime) Launch(_ context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	close(r.launching)
	<-r.release
	return noderuntime.WorkloadStatus{ID: spec.ID, State: noderuntime.WorkloadRunning}, nil
}

// TestFactsLoop_WaitsForLaunchInFlight: the report an image ensure
// triggers (the prepare before a launch) is not measured while the launch
// that follows is in flight, however long past the settle time it runs,
// and follows soon after it ends.
func TestFactsLoop_WaitsForLaunchInFlight(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "agent-facts")
	rt := gatedRuntime{launching: make(chan struct{}), release: make(chan struct{}), measured: make(chan time.Time, 16)}
	a, err := New(Config{NodeID: "node-facts", DataDir: t.TempDir(), FactsInterval: time.Hour}, conn, rt, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.journal.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	release := sync.OnceFunc(func() { close(rt.release) })
	t.Cleanup(func() { release(); cancel(); wg.Wait() })
	wg.Go(func() { a.factsLoop(ctx, time.Hour) })

	if _, err := a.rt.EnsureImage(ctx, noderuntime.ImageSpec{}); err != nil {
		t.Fatal(err)
	}
	ensured := time.Now()
	launched := make(chan error, 1)
	wg.Go(func() {
		_, err := a.rt.Launch(ctx, noderuntime.WorkloadSpec{ID: "a1"})
		launched <- err
	})
	<-rt.launching
	select {
	case at := <-rt.measured:
		t.Fatalf("facts measured %s after the ensure, with the launch still in flight", at.Sub(ensured))
	case <-time.After(factsSettle + time.Second):
	}
	ended := time.Now()
	release()
	if err := <-launched; err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-rt.measured:
		t.Logf("facts measured %s after the launch ended", at.Sub(ended))
	case <-time.After(10 * time.Second):
		t.Fatal("no facts measured after the launch ended")
	}
}
