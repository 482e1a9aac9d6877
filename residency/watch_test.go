package residency

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// residencyLog records every write to wf_residency, in order, to check
// invariant 3: the epoch never goes backwards and nothing is deleted.
type residencyLog struct {
	mu      sync.Mutex
	byKey   map[string][]Observation
	deletes []string
}

func watchResidency(t testing.TB, env *busEnv) *residencyLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := env.js.KeyValue(ctx, bus.BucketResidency)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	l := &residencyLog{byKey: map[string][]Observation{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				l.mu.Lock()
				if e.Operation() != jetstream.KeyValuePut {
					l.deletes = append(l.deletes, e.Key())
				} else {
					var o Observation
					if err := json.Unmarshal(e.Value(), &o); err == nil {
						l.byKey[e.Key()] = append(l.byKey[e.Key()], o)
					}
				}
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = w.Stop()
		cancel()
		<-done
	})
	return l
}

// check verifies key's history: epochs never decrease, an epoch once
// tombstoned is never published again, and nothing was deleted.
func (l *residencyLog) check(key Key) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.deletes) > 0 {
		return fmt.Errorf("wf_residency keys deleted or purged: %v", l.deletes)
	}
	var (
		max        ResidencyEpoch
		tombstoned = map[ResidencyEpoch]bool{}
	)
	for i, o := range l.byKey[key.String()] {
		if o.Epoch < max {
			return fmt.Errorf("write %d: epoch went back from %d to %d (%s by %s)", i, max, o.Epoch, o.State, o.Host)
		}
		if tombstoned[o.Epoch] && o.State != StateExpired {
			return fmt.Errorf("write %d: epoch %d published %s after its tombstone", i, o.Epoch, o.State)
		}
		max = o.Epoch
		if o.State == StateExpired {
			tombstoned[o.Epoch] = true
		}
	}
	return nil
}

func (l *residencyLog) history(key Key) []Observation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Observation(nil), l.byKey[key.String()]...)
}

// consumption records inbox consumer windows: each start and stop, in one
// global order.
type consumption struct {
	mu     sync.Mutex
	events []consumeEvent
}

type consumeEvent struct {
	host  string
	key   Key
	epoch ResidencyEpoch
	on    bool
}

func newConsumption() *consumption { return &consumption{} }

func (c *consumption) hook(hostID string) func(Key, ResidencyEpoch, bool) {
	return func(k Key, e ResidencyEpoch, on bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.events = append(c.events, consumeEvent{hostID, k, e, on})
	}
}

// check verifies that per key, windows of different grants never overlap:
// a consumer starts only when no other grant's consumer is running.
func (c *consumption) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	open := map[Key]map[string]bool{}
	for i, ev := range c.events {
		id := fmt.Sprintf("%s/e%d", ev.host, ev.epoch)
		if open[ev.key] == nil {
			open[ev.key] = map[string]bool{}
		}
		if ev.on {
			for other := range open[ev.key] {
				if other != id {
					return fmt.Errorf("event %d: %s started consuming %s while %s still was", i, id, ev.key, other)
				}
			}
			open[ev.key][id] = true
		} else {
			delete(open[ev.key], id)
		}
	}
	return nil
}

// running lists grants whose consumer is running for key.
func (c *consumption) running(key Key) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	open := map[string]bool{}
	for _, ev := range c.events {
		if ev.key != key {
			continue
		}
		id := fmt.Sprintf("%s/e%d", ev.host, ev.epoch)
		if ev.on {
			open[id] = true
		} else {
			delete(open, id)
		}
	}
	var out []string
	for id := range open {
		out = append(out, id)
	}
	return out
}
