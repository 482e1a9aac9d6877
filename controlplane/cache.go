package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// cache is this replica's read-only view of wf_runs and wf_nodes, fed by KV
// watches. Decisions read it; every write still goes to KV by CAS, so a
// stale cache costs a retry, never a wrong write.
type cache struct {
	mu    sync.RWMutex
	runs  map[string]cachedRun
	nodes map[string]cachedNode
}

type cachedRun struct {
	run schemas.Run
	rev uint64
}

type cachedNode struct {
	node schemas.NodeRecord
	rev  uint64
}

func newCache() *cache {
	return &cache{runs: map[string]cachedRun{}, nodes: map[string]cachedNode{}}
}

// start opens both watches and blocks until their initial values are in.
// The watch goroutines run until ctx ends; wg tracks them.
func (c *cache) start(ctx context.Context, wg *sync.WaitGroup, runsKV, nodesKV jetstream.KeyValue, log *zap.Logger) error {
	var primed []chan struct{}
	for _, w := range []struct {
		kv    jetstream.KeyValue
		apply func(jetstream.KeyValueEntry)
	}{{runsKV, c.applyRun}, {nodesKV, c.applyNode}} {
		watcher, err := w.kv.WatchAll(ctx)
		if err != nil {
			return fmt.Errorf("controlplane: watch %s: %w", w.kv.Bucket(), err)
		}
		done := make(chan struct{})
		primed = append(primed, done)
		wg.Go(func() {
			defer func() { _ = watcher.Stop() }()
			for {
				select {
				case <-ctx.Done():
					return
				case e, ok := <-watcher.Updates():
					if !ok {
						return
					}
					if e == nil { // end of initial values
						close(done)
						continue
					}
					w.apply(e)
				}
			}
		})
	}
	for _, done := range primed {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	log.Debug("kv cache primed", zap.Int("runs", c.runCount()), zap.Int("nodes", c.nodeCount()))
	return nil
}

func (c *cache) applyRun(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.runs, e.Key())
		return
	}
	if old, ok := c.runs[e.Key()]; ok && old.rev >= e.Revision() {
		return
	}
	var r schemas.Run
	if json.Unmarshal(e.Value(), &r) != nil {
		return
	}
	c.runs[e.Key()] = cachedRun{r, e.Revision()}
}

func (c *cache) applyNode(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.nodes, e.Key())
		return
	}
	if old, ok := c.nodes[e.Key()]; ok && old.rev >= e.Revision() {
		return
	}
	var n schemas.NodeRecord
	if json.Unmarshal(e.Value(), &n) != nil {
		return
	}
	c.nodes[e.Key()] = cachedNode{n, e.Revision()}
}

// noteRun records a Run this replica just wrote, ahead of its watch.
func (c *cache) noteRun(r schemas.Run, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.runs[r.ID]; ok && old.rev >= rev {
		return
	}
	c.runs[r.ID] = cachedRun{r, rev}
}

func (c *cache) runCount() int  { c.mu.RLock(); defer c.mu.RUnlock(); return len(c.runs) }
func (c *cache) nodeCount() int { c.mu.RLock(); defer c.mu.RUnlock(); return len(c.nodes) }

// activeRuns returns every non-terminal Run.
func (c *cache) activeRuns() []schemas.Run {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]schemas.Run, 0, len(c.runs))
	for _, cr := range c.runs {
		if !cr.run.Phase.Terminal() {
			out = append(out, cr.run)
		}
	}
	return out
}

// nodeList returns every node record.
func (c *cache) nodeList() []schemas.NodeRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]schemas.NodeRecord, 0, len(c.nodes))
	for _, cn := range c.nodes {
		out = append(out, cn.node)
	}
	return out
}

func (c *cache) node(id string) (schemas.NodeRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cn, ok := c.nodes[id]
	return cn.node, ok
}

// applyNodeRecord records a node this replica just wrote, ahead of its watch.
func (c *cache) applyNodeRecord(n schemas.NodeRecord, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.nodes[n.NodeID]; ok && old.rev >= rev {
		return
	}
	c.nodes[n.NodeID] = cachedNode{n, rev}
}
