package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/schemas"
)

// RunPhases keeps the phase of every Run in wf_runs, fed by a KV watch, so a
// scrape reads counts kept in memory instead of reading the bucket: the
// cost is one decode per Run update, and the memory one small entry per
// Run the bucket holds.
type RunPhases struct {
	mu     sync.Mutex
	phase  map[string]schemas.Phase // run id → phase
	counts map[schemas.Phase]int
	synced bool // the watch has delivered every Run that existed when it started
	done   chan struct{}
}

// WatchRunPhases starts watching kv (the wf_runs bucket) until ctx ends.
func WatchRunPhases(ctx context.Context, kv jetstream.KeyValue) (*RunPhases, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("metrics: watch %s: %w", kv.Bucket(), err)
	}
	p := &RunPhases{phase: map[string]schemas.Phase{}, counts: map[schemas.Phase]int{}, done: make(chan struct{})}
	go func() {
		<-ctx.Done()
		_ = w.Stop()
	}()
	go func() {
		defer close(p.done)
		for e := range w.Updates() {
			p.apply(e)
		}
	}()
	return p, nil
}

// apply folds one watch entry in; nil marks the end of the initial values.
func (p *RunPhases) apply(e jetstream.KeyValueEntry) {
	var (
		phase   schemas.Phase
		present bool
	)
	if e != nil && e.Operation() == jetstream.KeyValuePut {
		var r struct {
			Phase schemas.Phase `json:"phase"`
		}
		if json.Unmarshal(e.Value(), &r) == nil && r.Phase != "" {
			phase, present = r.Phase, true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e == nil {
		p.synced = true
		return
	}
	if old, ok := p.phase[e.Key()]; ok {
		p.counts[old]--
		if p.counts[old] == 0 {
			delete(p.counts, old)
		}
		delete(p.phase, e.Key())
	}
	if present {
		p.phase[e.Key()] = phase
		p.counts[phase]++
	}
}

// Counts returns how many Runs are in each phase, and whether the watch has
// caught up with the bucket as it was when the watch started.
func (p *RunPhases) Counts() (map[schemas.Phase]int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.counts), p.synced
}

// Done is closed once the watch has stopped (its context ended); the counts
// no longer move after that.
func (p *RunPhases) Done() <-chan struct{} { return p.done }
