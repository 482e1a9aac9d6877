package agent

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// AcceleratorProbe measures the host's accelerators (adapters/gpuprobe holds
// the NVIDIA one, which runs cmd/warmfleet-gpu-probe, and a fake for tests).
// It states what it established and never fails: a probe that could not look
// returns Established false.
type AcceleratorProbe interface {
	Probe(ctx context.Context) schemas.AcceleratorFacts
}

// AcceleratorProbeFunc adapts a function to AcceleratorProbe.
type AcceleratorProbeFunc func(ctx context.Context) schemas.AcceleratorFacts

// Probe calls f.
func (f AcceleratorProbeFunc) Probe(ctx context.Context) schemas.AcceleratorFacts { return f(ctx) }

// DefaultAcceleratorTimeout bounds one accelerator probe unless
// Config.AcceleratorTimeout says otherwise: facts wait no longer for it.
const DefaultAcceleratorTimeout = 2 * time.Second

// boundedProbe keeps a slow or hung probe from holding up facts: past its
// timeout the agent states Established false and moves on. Reports measured
// at the same time share one probe call. The call itself may be stuck in a
// driver (a cgo call cannot be interrupted), so it is left to finish on its
// own and no second one starts until it has: one stuck driver costs one
// goroutine, never one per report.
type boundedProbe struct {
	probe   AcceleratorProbe // nil: no probe configured, nothing established
	timeout time.Duration
	log     *zap.Logger

	mu   sync.Mutex
	call *probeCall // the call running now; nil when none
}

// probeCall is one probe call; facts is set before done closes.
type probeCall struct {
	done  chan struct{}
	facts schemas.AcceleratorFacts
}

func (b *boundedProbe) measure(ctx context.Context) schemas.AcceleratorFacts {
	if b.probe == nil {
		return schemas.AcceleratorFacts{}
	}
	b.mu.Lock()
	c := b.call
	if c == nil {
		c = &probeCall{done: make(chan struct{})}
		b.call = c
		// Not in the agent's WaitGroup on purpose: Run must be able to
		// return while a driver call hangs. It is not tied to one caller's
		// ctx either, since later reports may share it; its own timeout
		// ends a probe that honours its context.
		go b.run(c)
	}
	b.mu.Unlock()
	timer := time.NewTimer(b.timeout)
	defer timer.Stop()
	select {
	case <-c.done:
		return c.facts
	case <-timer.C:
		b.log.Warn("accelerator probe did not answer in time; stating nothing established", zap.Duration("timeout", b.timeout))
	case <-ctx.Done():
	}
	return schemas.AcceleratorFacts{}
}

func (b *boundedProbe) run(c *probeCall) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("accelerator probe panicked; stating nothing established", zap.Any("panic", r))
			c.facts = schemas.AcceleratorFacts{}
		}
		b.mu.Lock()
		b.call = nil
		b.mu.Unlock()
		close(c.done)
	}()
	c.facts = b.probe.Probe(ctx)
}
