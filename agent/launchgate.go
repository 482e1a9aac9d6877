package agent

import (
	"context"
	"sync"
	"time"
)

// factsMaxDefer bounds how long a measurement waits for the launches in
// flight, so a node that never stops launching still reports.
const factsMaxDefer = 10 * time.Second

// launchGate counts the runtime's launches in flight, so facts are
// measured between them: a measurement's image inventory (content and
// snapshot reads for every image) goes to the daemon a launch waits on,
// and slowed the launches it overlapped by 50–150 ms in the e2e bench.
// Without it, the report an image ensure triggers lands factsSettle later
// on the launch that follows the ensure whenever that launch is slower.
type launchGate struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while no launch is in flight
}

func newLaunchGate() *launchGate {
	idle := make(chan struct{})
	close(idle)
	return &launchGate{idle: idle}
}

// begin marks a launch in flight until the returned end is called.
func (g *launchGate) begin() (end func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	return sync.OnceFunc(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.n--; g.n == 0 {
			close(g.idle)
		}
	})
}

// await returns once no launch is in flight, or after limit; false when ctx
// ended first.
func (g *launchGate) await(ctx context.Context, limit time.Duration) bool {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}
