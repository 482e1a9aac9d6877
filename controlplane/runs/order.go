package runs

import (
	"hash/maphash"
	"sync"
)

// runStripes is how many locks keep Runs' writes and publishes in order;
// Runs whose ids share a stripe wait for each other.
const runStripes = 256

// publishOrder keeps each Run's events in WF_EVENTS in seq order, as this
// replica writes them: a write and the publish of its events happen under
// the Run's stripe, so a later change's events never overtake an earlier
// one's. (Two replicas writing one Run at once may still interleave; the
// seq in every event says the order.)
type publishOrder struct {
	seed  maphash.Seed
	locks [runStripes]sync.Mutex
}

func newPublishOrder() *publishOrder { return &publishOrder{seed: maphash.MakeSeed()} }

// lock holds runID's stripe until the returned func is called.
func (o *publishOrder) lock(runID string) (unlock func()) {
	mu := &o.locks[maphash.String(o.seed, runID)%runStripes]
	mu.Lock()
	return mu.Unlock
}
