// Package cache is one replica's read-only copy of the active Runs in
// wf_runs and of wf_nodes, fed by KV watches, and the node leases its
// heartbeats earned in memory. Ended Runs are not held: they stay in
// wf_runs for the retention period, and whoever needs one reads it there.
package cache

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// Cache is this replica's read-only view of wf_runs and wf_nodes, fed by KV
// watches. Decisions read it; every write still goes to KV by CAS, so a
// stale cache costs a retry, never a wrong write.
//
// It also holds the replica's lease table: heartbeats extend a node's lease
// here, in memory, instead of rewriting its wf_nodes record each time. Every
// replica sees every heartbeat, so every replica holds the same table. A
// node's effective lease is the later of its record's LeaseExpires and the
// in-memory lease its current session (fencing token) earned; Node and
// Nodes return records with that effective lease.
type Cache struct {
	mu sync.RWMutex
	// runs holds the active Runs, and for a moment the raw JSON of an
	// ended one the watch delivered, until it is decoded and dropped.
	runs map[string]cachedRun
	// undecoded names the runs entries held only as raw JSON.
	undecoded map[string]struct{}
	// watched is the highest wf_runs revision the watch delivered: every
	// write up to it is reflected in runs.
	watched uint64
	// ended holds, by Run id, the revision at which this replica wrote a
	// Run's end, until the watch delivers that revision: an older write
	// it delivers meanwhile must not bring the Run back.
	ended  map[string]uint64
	nodes  map[string]cachedNode
	leases map[string]memLease
	// residencies are wf_residency's observations, by session key: what
	// resident sessions hold on their hosts.
	residencies map[string]cachedResidency
	// pending are holds booked for sessions still attaching, by session
	// key, until their residency is published (Reserve).
	pending map[string]residency.Observation
	// nodeVer counts changes to the node set, so a fleet snapshot can tell
	// whether it still shows the nodes as they are.
	nodeVer uint64
}

// memLease is a lease extended by heartbeats of one session of a node.
type memLease struct {
	token   uint64
	expires time.Time
}

type cachedRun struct {
	// run is never changed once stored (a write replaces it), so
	// activeRuns can hand out the pointer instead of a copy.
	run *schemas.Run
	rev uint64
	// raw is the stored JSON of the Run, to seed its next CAS without a
	// read.
	raw []byte
	// undecoded: only raw is held yet. The watch does not decode what it
	// delivers, because this replica's own write is usually noted a moment
	// later with the value in hand; what is left is decoded when read.
	undecoded bool
}

type cachedNode struct {
	node schemas.NodeRecord
	rev  uint64
}

type cachedResidency struct {
	obs residency.Observation
	rev uint64
}

// New returns an empty cache; Start fills it.
func New() *Cache {
	return &Cache{runs: map[string]cachedRun{}, undecoded: map[string]struct{}{}, ended: map[string]uint64{}, nodes: map[string]cachedNode{}, leases: map[string]memLease{},
		residencies: map[string]cachedResidency{}, pending: map[string]residency.Observation{}}
}

// Start opens the watches of wf_runs, wf_nodes and wf_residency and
// blocks until their initial values are in. The watch goroutines run until
// ctx ends; wg tracks them.
func (c *Cache) Start(ctx context.Context, wg *sync.WaitGroup, runsKV, nodesKV, residencyKV jetstream.KeyValue, log *zap.Logger) error {
	if err := bus.Mirror(ctx, wg, runsKV, c.applyRun); err != nil {
		return err
	}
	if err := bus.Mirror(ctx, wg, nodesKV, c.applyNode); err != nil {
		return err
	}
	if err := bus.Mirror(ctx, wg, residencyKV, c.applyResidency); err != nil {
		return err
	}
	log.Debug("kv cache primed", zap.Int("runs", c.RunCount()), zap.Int("nodes", c.NodeCount()))
	return nil
}

func (c *Cache) applyRun(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = max(c.watched, e.Revision())
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.runs, e.Key())
		delete(c.undecoded, e.Key())
		delete(c.ended, e.Key())
		return
	}
	if rev, ok := c.ended[e.Key()]; ok {
		if rev > e.Revision() {
			return // older than the end this replica wrote
		}
		delete(c.ended, e.Key())
		if rev == e.Revision() {
			return
		}
	}
	if old, ok := c.runs[e.Key()]; ok && old.rev >= e.Revision() {
		return
	}
	c.runs[e.Key()] = cachedRun{rev: e.Revision(), raw: e.Value(), undecoded: true}
	c.undecoded[e.Key()] = struct{}{}
}

// decodeRuns decodes the Runs held only as raw JSON, outside the lock. A
// value that does not decode is dropped: no decision is made on a Run that
// cannot be read. An ended Run is dropped too: scheduling never needs it.
func (c *Cache) decodeRuns(only string) {
	type pending struct {
		key string
		cr  cachedRun
	}
	var todo []pending
	c.mu.RLock()
	if only != "" {
		if cr := c.runs[only]; cr.undecoded {
			todo = append(todo, pending{only, cr})
		}
	} else {
		for k := range c.undecoded {
			todo = append(todo, pending{k, c.runs[k]})
		}
	}
	c.mu.RUnlock()
	if len(todo) == 0 {
		return
	}
	runs := make([]schemas.Run, len(todo))
	ok := make([]bool, len(todo))
	for i, p := range todo {
		ok[i] = json.Unmarshal(p.cr.raw, &runs[i]) == nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range todo {
		if cur := c.runs[p.key]; !cur.undecoded || cur.rev != p.cr.rev {
			continue // replaced meanwhile
		}
		delete(c.undecoded, p.key)
		if !ok[i] || runs[i].Phase.Terminal() {
			delete(c.runs, p.key)
			continue
		}
		r := runs[i] // a copy: a pointer into runs would keep them all
		c.runs[p.key] = cachedRun{run: &r, rev: p.cr.rev, raw: p.cr.raw}
	}
	if only == "" {
		// An end the watch skipped past (it restarted) is settled too.
		for k, rev := range c.ended {
			if rev <= c.watched {
				delete(c.ended, k)
			}
		}
	}
}

// applyNode takes a wf_nodes update from the watch. A revision this replica
// already holds (it wrote it and noted it with NoteNode) is not
// decoded again, and decoding happens outside the lock, so heartbeats are
// not held up by a large facts record.
func (c *Cache) applyNode(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		c.mu.Lock()
		delete(c.nodes, e.Key())
		delete(c.leases, e.Key())
		c.nodeVer++
		c.mu.Unlock()
		return
	}
	if c.nodeRev(e.Key()) >= e.Revision() {
		return
	}
	var n schemas.NodeRecord
	if json.Unmarshal(e.Value(), &n) != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.nodes[e.Key()]; ok && old.rev >= e.Revision() {
		return
	}
	c.nodes[e.Key()] = cachedNode{n, e.Revision()}
	c.nodeVer++
}

// applyResidency takes a wf_residency update from the watch. Only the
// residencies that hold something are kept.
func (c *Cache) applyResidency(e jetstream.KeyValueEntry) {
	var o residency.Observation
	put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &o) == nil && o.Holds()
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.residencies[e.Key()]
	if had && old.rev >= e.Revision() {
		return
	}
	if !put {
		delete(c.residencies, e.Key())
	} else {
		c.residencies[e.Key()] = cachedResidency{o, e.Revision()}
	}
	// A host's heartbeat republishes its residencies; only a change of
	// what a node holds makes fleet snapshots (and decisions) stale.
	if had != put || (put && !sameHold(old.obs, o)) {
		c.nodeVer++
	}
}

// sameHold reports whether two observations hold the same on the same host.
func sameHold(a, b residency.Observation) bool {
	return a.Host == b.Host && a.CPUMillis == b.CPUMillis && a.MemoryBytes == b.MemoryBytes && slices.Equal(a.GPUs, b.GPUs)
}

// Residencies returns the resident sessions that hold resources on a host,
// and the holds reserved for sessions still attaching.
func (c *Cache) Residencies() []residency.Observation {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]residency.Observation, 0, len(c.residencies)+len(c.pending))
	for _, r := range c.residencies {
		out = append(out, r.obs)
	}
	for k, p := range c.pending {
		if _, published := c.residencies[k]; !published {
			out = append(out, p)
		}
	}
	return out
}

// Reserve books hold (a session's host, resources and cards) while its
// attach runs, so nothing else is booked on them before its residency is
// published; release drops it.
func (c *Cache) Reserve(hold residency.Observation) (release func()) {
	k := hold.Key().String()
	c.mu.Lock()
	c.pending[k] = hold
	c.nodeVer++
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.pending, k)
		c.nodeVer++
		c.mu.Unlock()
	}
}

// NodeVersion is the node set's change count.
func (c *Cache) NodeVersion() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.nodeVer
}

// nodeRev is the revision of node id held, or 0.
func (c *Cache) nodeRev(id string) uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.nodes[id].rev
}

// NoteRun records a Run this replica just wrote (raw is the JSON stored),
// ahead of its watch. A Run that ended leaves the cache.
func (c *Cache) NoteRun(r schemas.Run, rev uint64, raw []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.runs[r.ID]
	switch {
	case ok && (old.rev > rev || old.rev == rev && !old.undecoded):
		return
	case !ok && (rev <= c.watched || c.ended[r.ID] >= rev):
		return // the watch, or this replica, already has it at rev or later
	}
	delete(c.undecoded, r.ID)
	if r.Phase.Terminal() {
		delete(c.runs, r.ID)
		if rev > c.watched {
			c.ended[r.ID] = rev
		}
		return
	}
	c.runs[r.ID] = cachedRun{run: &r, rev: rev, raw: raw}
}

// RunSeed is the stored form of an active Run, to start a CAS from; an
// ended Run has none, so its write starts with a read.
func (c *Cache) RunSeed(id string) bus.Seed {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cr := c.runs[id]
	return bus.Seed{JSON: cr.raw, Revision: cr.rev}
}

// Run returns one active Run; an ended one is not held (read wf_runs).
func (c *Cache) Run(id string) (schemas.Run, bool) {
	c.decodeRuns(id)
	c.mu.RLock()
	defer c.mu.RUnlock()
	cr, ok := c.runs[id]
	if !ok || cr.undecoded {
		return schemas.Run{}, false
	}
	return *cr.run, true
}

// RunPhases counts the active Runs by phase. Runs held only as raw JSON are
// decoded first, outside the lock (as ActiveRuns does, and kept); one that
// arrives meanwhile is counted from its phase alone. A value that does not
// decode, or has no phase, is not counted. The counts follow wf_runs only
// once Start has returned.
func (c *Cache) RunPhases() map[schemas.Phase]int {
	c.decodeRuns("")
	c.mu.RLock()
	defer c.mu.RUnlock()
	counts := map[schemas.Phase]int{}
	for _, cr := range c.runs {
		var r struct {
			Phase schemas.Phase `json:"phase"`
		}
		if !cr.undecoded {
			r.Phase = cr.run.Phase
		} else if json.Unmarshal(cr.raw, &r) != nil {
			continue
		}
		if r.Phase != "" && !r.Phase.Terminal() {
			counts[r.Phase]++
		}
	}
	return counts
}

// RunCount is how many Runs the cache holds: the active ones, and ended
// ones whose watch update is not yet decoded (and dropped).
func (c *Cache) RunCount() int  { c.mu.RLock(); defer c.mu.RUnlock(); return len(c.runs) }
func (c *Cache) NodeCount() int { c.mu.RLock(); defer c.mu.RUnlock(); return len(c.nodes) }

// ActiveRuns returns every non-terminal Run. One that arrives while it
// runs, still undecoded, is left for the next call. The Runs are shared
// with the cache: read them, never change them.
func (c *Cache) ActiveRuns() []*schemas.Run {
	c.decodeRuns("")
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*schemas.Run, 0, len(c.runs))
	for _, cr := range c.runs {
		if !cr.undecoded && !cr.run.Phase.Terminal() {
			out = append(out, cr.run)
		}
	}
	return out
}

// Nodes returns every node record, each with its effective lease.
func (c *Cache) Nodes() []schemas.NodeRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]schemas.NodeRecord, 0, len(c.nodes))
	for _, cn := range c.nodes {
		out = append(out, c.withLeaseLocked(cn.node))
	}
	return out
}

// Node returns one node record with its effective lease.
func (c *Cache) Node(id string) (schemas.NodeRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cn, ok := c.nodes[id]
	if !ok {
		return schemas.NodeRecord{}, false
	}
	return c.withLeaseLocked(cn.node), true
}

// withLeaseLocked returns n with LeaseExpires raised to the in-memory lease
// of n's current session, when that is later. c.mu is held.
func (c *Cache) withLeaseLocked(n schemas.NodeRecord) schemas.NodeRecord {
	if l, ok := c.leases[n.NodeID]; ok && l.token == n.FencingToken && l.expires.After(n.LeaseExpires) {
		n.LeaseExpires = l.expires
	}
	return n
}

// WithLease returns n, a record read from wf_nodes, with LeaseExpires
// raised to the in-memory lease of n's current session, when that is later.
func (c *Cache) WithLease(n schemas.NodeRecord) schemas.NodeRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.withLeaseLocked(n)
}

// HeartbeatResult says what the cache made of a heartbeat.
type HeartbeatResult int

const (
	// HeartbeatExtended: the cached record vouches for the session and the
	// node is not lost; its in-memory lease now runs to the given time.
	HeartbeatExtended HeartbeatResult = iota
	// HeartbeatFenced: the node has a newer session than the heartbeat's.
	// Fencing tokens only rise, so the store cannot say otherwise.
	HeartbeatFenced
	// HeartbeatCheckStore: the cache cannot decide (node unknown to it, a
	// newer token than it holds, or the node is marked lost); the caller
	// reads wf_nodes.
	HeartbeatCheckStore
)

// Heartbeat extends node id's in-memory lease to until when token is the
// cached record's current session and the node is not lost.
func (c *Cache) Heartbeat(id string, token uint64, until time.Time) HeartbeatResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	cn, ok := c.nodes[id]
	switch {
	case !ok || token > cn.node.FencingToken:
		return HeartbeatCheckStore
	case token < cn.node.FencingToken:
		return HeartbeatFenced
	case cn.node.State == schemas.NodeLost:
		return HeartbeatCheckStore
	}
	c.extendLeaseLocked(id, token, until)
	return HeartbeatExtended
}

// ExtendLease raises node id's in-memory lease for session token to until.
func (c *Cache) ExtendLease(id string, token uint64, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.extendLeaseLocked(id, token, until)
}

func (c *Cache) extendLeaseLocked(id string, token uint64, until time.Time) {
	if l, ok := c.leases[id]; ok && l.token == token && !until.After(l.expires) {
		return
	}
	c.leases[id] = memLease{token: token, expires: until}
}

// GraceLeases gives every node that is not lost an in-memory lease until
// until for its current session. A replica that just started has heard no
// heartbeats yet, and the lease in a record is only rewritten on a state
// change, so without this it would mark every node lost on its first pass.
func (c *Cache) GraceLeases(until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, cn := range c.nodes {
		if cn.node.State != schemas.NodeLost {
			c.extendLeaseLocked(id, cn.node.FencingToken, until)
		}
	}
}

// NoteNode records a node this replica just wrote, ahead of its watch.
func (c *Cache) NoteNode(n schemas.NodeRecord, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.nodes[n.NodeID]; ok && old.rev >= rev {
		return
	}
	c.nodes[n.NodeID] = cachedNode{n, rev}
	c.nodeVer++
}
