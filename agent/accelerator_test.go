package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestBoundedProbe_HungProbeCostsOneGoroutine(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	b := &boundedProbe{timeout: 20 * time.Millisecond, log: zaptest.NewLogger(t),
		probe: AcceleratorProbeFunc(func(context.Context) schemas.AcceleratorFacts {
			calls.Add(1)
			<-release
			return h100
		})}
	if got := b.measure(context.Background()); got.Established {
		t.Fatalf("timed out probe stated %+v", got)
	}
	// While the first call hangs, later reports state nothing and start no
	// second call.
	for range 3 {
		if got := b.measure(context.Background()); got.Established {
			t.Fatalf("probe still hung, stated %+v", got)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d probe calls while one hung, want 1", n)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got := b.measure(context.Background()); got.GPUCount() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("probe never recovered after the hung call returned")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBoundedProbe_ConcurrentReportsShareOneCall(t *testing.T) {
	var calls atomic.Int32
	b := &boundedProbe{timeout: 5 * time.Second, log: zaptest.NewLogger(t),
		probe: AcceleratorProbeFunc(func(context.Context) schemas.AcceleratorFacts {
			calls.Add(1)
			time.Sleep(100 * time.Millisecond)
			return h100
		})}
	results := make(chan schemas.AcceleratorFacts, 4)
	for range 4 {
		go func() { results <- b.measure(context.Background()) }()
	}
	for range 4 {
		if got := <-results; got.GPUCount() != 2 {
			t.Fatalf("a report sharing the probe got %+v, want the probe's answer", got)
		}
	}
	if n := calls.Load(); n < 1 || n > 4 {
		t.Fatalf("%d calls", n)
	}
	t.Logf("4 concurrent reports made %d probe call(s)", calls.Load())
}

func TestBoundedProbe_PanicStatesNothing(t *testing.T) {
	b := &boundedProbe{timeout: time.Second, log: zaptest.NewLogger(t),
		probe: AcceleratorProbeFunc(func(context.Context) schemas.AcceleratorFacts { panic("driver binding bug") })}
	for range 2 { // and the next report probes again
		if got := b.measure(context.Background()); got.Established {
			t.Fatalf("panicking probe stated %+v", got)
		}
	}
}

func TestBoundedProbe_NilProbeStatesNothing(t *testing.T) {
	b := &boundedProbe{timeout: time.Second, log: zaptest.NewLogger(t)}
	if got := b.measure(context.Background()); got.Established {
		t.Fatalf("no probe stated %+v", got)
	}
}
