package scheduler

import (
	"hash/maphash"
	"strconv"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// memoMaxAge bounds how long a waiting Run goes without a fresh decision:
// decisions also read the clock (when bookings should end), which no
// fleet change signals.
const memoMaxAge = 5 * time.Second

// decisionMemo lets a scheduling pass skip a waiting Run whose fleet has
// not changed since its last decision: the same nodes (cache.nodeVersion)
// and the same bookings. Deciding again would only give the same answer,
// which schedule already declines to record, at the price of a placement
// decision per waiting Run per pass. It belongs to the scheduling loop.
type decisionMemo struct {
	seed  maphash.Seed
	byRun map[string]memoEntry
	next  map[string]memoEntry
}

type memoEntry struct {
	fleet uint64
	at    time.Time
}

func newDecisionMemo() *decisionMemo {
	return &decisionMemo{seed: maphash.MakeSeed(), byRun: map[string]memoEntry{}, next: map[string]memoEntry{}}
}

// fleetKey fingerprints what placement reads: the node set's version and
// every booking (a Run on a node, its phase, whether queued, since when).
// Runs come in any order, so the per-booking hashes are summed.
func (m *decisionMemo) fleetKey(nodeVer uint64, runs []*schemas.Run) uint64 {
	key := maphash.String(m.seed, strconv.FormatUint(nodeVer, 10))
	for _, r := range runs {
		if r.NodeID == "" || r.Phase == schemas.PhaseAccepted {
			continue
		}
		key += maphash.String(m.seed, r.ID+"\x00"+r.NodeID+"\x00"+string(r.Phase)+"\x00"+strconv.FormatBool(r.Queued)+"\x00"+strconv.FormatInt(r.PhaseSince.UnixNano(), 10))
	}
	return key
}

// fresh reports whether r, waiting, was last decided against this fleet
// recently enough to skip; it carries the entry into the next pass.
func (m *decisionMemo) fresh(r *schemas.Run, fleet uint64, now time.Time) bool {
	e, ok := m.byRun[r.ID]
	if !ok || r.Waiting == "" || e.fleet != fleet || now.Sub(e.at) >= memoMaxAge {
		return false
	}
	m.next[r.ID] = e
	return true
}

// decided records that r was decided against fleet.
func (m *decisionMemo) decided(runID string, fleet uint64, now time.Time) {
	m.next[runID] = memoEntry{fleet, now}
}

// endPass keeps only the Runs seen waiting in this pass.
func (m *decisionMemo) endPass() {
	m.byRun, m.next = m.next, m.byRun
	clear(m.next)
}
