package nodecreds

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/warmfleet/warmfleet/schemas"
)

// Limit is how often one node may ask one credential service: a token
// bucket of Burst requests refilled at PerSecond. Every answered request
// may run a credential helper or write an artifact grant, so the limit
// bounds both per node.
type Limit struct {
	PerSecond float64
	Burst     int
}

// DefaultLimit lets a node prepare several Runs of MaxArtifacts artifacts
// each, and a prefetch, in one burst, and then one request every half
// second: a node at the limit holds at most Burst + PerSecond × the grant
// TTL live artifact grants.
var DefaultLimit = Limit{PerSecond: 2, Burst: 64}

// Validate refuses a limit that would refuse every request.
func (l Limit) Validate() error {
	if l.PerSecond <= 0 || l.Burst < 1 {
		return fmt.Errorf("a credential rate limit needs a positive rate and a burst of at least 1 (got %g/s, burst %d)", l.PerSecond, l.Burst)
	}
	return nil
}

func (l Limit) String() string { return fmt.Sprintf("%g/s (burst %d)", l.PerSecond, l.Burst) }

// pruneAt is how many buckets the limiter holds before it drops those
// that are full again (a full bucket is the same as a new one).
const pruneAt = 1024

// Limiter holds one token bucket per node. The map's size is bounded by
// the fleet: the services ask it only after the node's session is checked.
type Limiter struct {
	limit Limit
	now   func() time.Time

	mu    sync.Mutex
	nodes map[string]*rate.Limiter
}

// NewLimiter returns a limiter of l (DefaultLimit when l is zero) on
// clock now.
func NewLimiter(l Limit, now func() time.Time) *Limiter {
	if l == (Limit{}) {
		l = DefaultLimit
	}
	return &Limiter{limit: l, now: now, nodes: map[string]*rate.Limiter{}}
}

// Limit is the limiter's limit.
func (l *Limiter) Limit() Limit { return l.limit }

// Allow takes one request of nodeID from its bucket, or refuses it with
// schemas.CodeRateLimited, saying the limit and when to ask again; what
// names the credential. A refused request takes nothing from the bucket.
func (l *Limiter) Allow(nodeID, what string) *schemas.Refusal {
	now := l.now()
	l.mu.Lock()
	b, ok := l.nodes[nodeID]
	if !ok {
		if len(l.nodes) >= pruneAt {
			l.prune(now)
		}
		b = rate.NewLimiter(rate.Limit(l.limit.PerSecond), l.limit.Burst)
		l.nodes[nodeID] = b
	}
	r := b.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	if wait > 0 {
		r.CancelAt(now)
	}
	l.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	// Round up so a node that waits exactly this long is admitted.
	wait = wait.Truncate(time.Millisecond) + time.Millisecond
	return &schemas.Refusal{Code: schemas.CodeRateLimited, Field: "node_id", RetryAfterMillis: wait.Milliseconds(),
		Reason: fmt.Sprintf("node %s asked for %s more often than %s; ask again in %s", nodeID, what, l.limit, wait)}
}

// prune drops the buckets that are full at now. Called with mu held.
func (l *Limiter) prune(now time.Time) {
	for id, b := range l.nodes {
		if b.TokensAt(now) >= float64(l.limit.Burst) {
			delete(l.nodes, id)
		}
	}
}
