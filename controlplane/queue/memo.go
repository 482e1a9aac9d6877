package queue

import (
	"hash/maphash"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// memoMaxAge bounds how long a waiting Run goes without a fresh decision:
// decisions also read the clock (when bookings should end), which no
// fleet change signals.
const memoMaxAge = 5 * time.Second

// Memo is the re-decision rule's memory, owned by the scheduling loop: a
// waiting Run is decided again only when something its last decision
// depended on changed. That is a key per Run over the nodes its Shape's
// last decision could use (a node that refused the shape for good is not
// one), each node's record and bookings, the policy's version and the
// Run's attempt. Quotas and budgets are checked every pass without a
// decision, and a Run that waits on either is forgotten here, so their
// move needs no key.
type Memo struct {
	seed  maphash.Seed
	pass  uint64
	byRun map[string]memoEntry
	// deps are, per Shape, the nodes its last decision depended on, for
	// the node set of nodeSet.
	deps map[Shape]shapeDeps
}

type memoEntry struct {
	key  uint64
	at   time.Time
	pass uint64
}

type shapeDeps struct {
	nodeSet uint64
	nodes   []string
}

// NewMemo returns an empty memo: every waiting Run is decided once.
func NewMemo() *Memo {
	return &Memo{seed: maphash.MakeSeed(), byRun: map[string]memoEntry{}, deps: map[Shape]shapeDeps{}}
}

// passKeys are one pass's fingerprints of the fleet.
type passKeys struct {
	nodeSet uint64            // which nodes there are
	nodes   map[string]uint64 // each node's record and bookings
	all     uint64
	policy  string
	shapes  map[Shape]uint64
}

// keysFor fingerprints in's fleet: each node's record as placement reads
// it, every booking on it (byNode: the booked Runs by node) and the
// preemptors its place is held for (claims).
func (m *Memo) keysFor(in Input, byNode map[string][]*schemas.Run, claims map[string][]claim) passKeys {
	k := passKeys{nodes: make(map[string]uint64, len(in.Fleet.Nodes)), policy: in.Policy.Version, shapes: map[Shape]uint64{}}
	for _, n := range in.Fleet.Nodes {
		id := n.Record.NodeID
		k.nodeSet += maphash.String(m.seed, id)
		k.nodes[id] = m.nodeKey(n, byNode[id], in.Now)
		for _, c := range claims[id] {
			k.nodes[id] += maphash.String(m.seed, "claim\x00"+c.runID)
		}
		k.all += k.nodes[id]
	}
	k.all += k.nodeSet
	return k
}

func (m *Memo) nodeKey(n *placement.Node, booked []*schemas.Run, now time.Time) uint64 {
	rec := &n.Record
	b := make([]byte, 0, 128)
	b = append(b, rec.NodeID...)
	b = append(b, 0)
	b = append(b, rec.State...)
	b = strconv.AppendBool(b, rec.Live(now))
	for _, v := range []int64{int64(rec.FencingToken), int64(rec.Generation), rec.Capacity.CPUMillis, rec.Capacity.MemoryBytes,
		rec.Capacity.GPUCount, rec.Capacity.DiskBytes, int64(rec.MaxWorkloads), rec.FactsReceivedAt.UnixNano()} {
		b = strconv.AppendInt(append(b, ' '), v, 10)
	}
	b = strconv.AppendFloat(b, rec.PricePerHour, 'g', -1, 64)
	key := maphash.Bytes(m.seed, b)
	// Sessions and Runs booked in this pass are bookings without a Run
	// record here: their id and cards stand for them.
	for _, bk := range n.Running {
		key += maphash.String(m.seed, "r\x00"+bk.RunID+"\x00"+strconv.Itoa(len(bk.GPUs)))
	}
	for _, bk := range n.Queued {
		key += maphash.String(m.seed, "q\x00"+bk.RunID+"\x00"+strconv.FormatBool(bk.Fetching))
	}
	for _, r := range booked {
		key += maphash.String(m.seed, r.ID+"\x00"+string(r.Phase)+"\x00"+strconv.FormatBool(r.Queued)+"\x00"+string(r.Stopping)+
			"\x00"+strconv.FormatInt(r.PhaseSince.UnixNano(), 10))
	}
	return key
}

// shapeKey fingerprints the nodes s depends on: those its last decision
// did not refuse for good, or every node when it has none for this node set.
func (m *Memo) shapeKey(k *passKeys, s Shape) uint64 {
	if v, ok := k.shapes[s]; ok {
		return v
	}
	v := k.all
	if d, ok := m.deps[s]; ok && d.nodeSet == k.nodeSet {
		v = k.nodeSet
		for _, id := range d.nodes {
			v += k.nodes[id]
		}
	}
	k.shapes[s] = v
	return v
}

// runKey is what r's decision depends on in this pass.
func (m *Memo) runKey(k *passKeys, r *schemas.Run, s Shape) uint64 {
	var buf [128]byte
	b := strconv.AppendUint(buf[:0], m.shapeKey(k, s), 10)
	b = append(append(b, 0), k.policy...)
	b = strconv.AppendInt(append(b, 0), int64(r.Attempt), 10)
	return maphash.Bytes(m.seed, b)
}

// fresh reports whether r, waiting, was decided against key recently
// enough to skip, and keeps it for the next pass.
func (m *Memo) fresh(r *schemas.Run, key uint64, now time.Time) bool {
	e, ok := m.byRun[r.ID]
	if !ok || r.Waiting == "" || e.key != key || now.Sub(e.at) >= memoMaxAge {
		return false
	}
	e.pass = m.pass
	m.byRun[r.ID] = e
	return true
}

// decided records that runID was decided (or left as it was) against key.
func (m *Memo) decided(runID string, key uint64, now time.Time) {
	m.byRun[runID] = memoEntry{key: key, at: now, pass: m.pass}
}

// forget drops runID: its next chance is a decision.
func (m *Memo) forget(runID string) { delete(m.byRun, runID) }

// dependsOn records the nodes d (a decision for a Run of shape s over the
// pass's fleet) could ever use.
func (m *Memo) dependsOn(k *passKeys, s Shape, d *schemas.BookingDecision) {
	deps := shapeDeps{nodeSet: k.nodeSet}
	for _, c := range d.Candidates {
		if !Permanent(c.Reason) || c.Eligible {
			deps.nodes = append(deps.nodes, c.NodeID)
		}
	}
	if len(m.deps) > maxShapes {
		clear(m.deps)
	}
	m.deps[s] = deps
	delete(k.shapes, s)
}

// maxShapes bounds the shapes whose dependencies are remembered.
const maxShapes = 4096

// endPass forgets, now and then, the Runs no pass saw for a while.
func (m *Memo) endPass() {
	m.pass++
	if m.pass%64 != 0 {
		return
	}
	for id, e := range m.byRun {
		if m.pass-e.pass > 64 {
			delete(m.byRun, id)
		}
	}
}
