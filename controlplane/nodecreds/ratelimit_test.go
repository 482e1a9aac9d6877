package nodecreds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestLimiter: a burst passes, the next is refused with the limit and the
// wait, which is exact; refused requests take nothing; the default admits
// a prepare burst of several Runs' artifacts; full buckets are pruned.
func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(Limit{PerSecond: 2, Burst: 4}, func() time.Time { return now })
	for i := range 4 {
		if r := l.Allow("n1", "x"); r != nil {
			t.Fatalf("request %d: %v", i, r)
		}
	}
	for range 10 { // refusals take nothing from the bucket
		r := l.Allow("n1", "artifact credentials")
		if r == nil || r.Code != schemas.CodeRateLimited || r.RetryAfter() != 501*time.Millisecond {
			t.Fatalf("past the burst: %+v, want rate_limited after 501ms", r)
		}
		if !strings.Contains(r.Reason, "2/s (burst 4)") || !strings.Contains(r.Reason, "artifact credentials") {
			t.Errorf("reason %q names neither the limit nor the credential", r.Reason)
		}
	}
	if r := l.Allow("n2", "x"); r != nil {
		t.Errorf("another node: %v", r)
	}
	now = now.Add(501 * time.Millisecond)
	if r := l.Allow("n1", "x"); r != nil {
		t.Errorf("after the wait: %v", r)
	}

	d := NewLimiter(Limit{}, func() time.Time { return now })
	if d.Limit() != DefaultLimit {
		t.Errorf("zero limit = %v, want the default", d.Limit())
	}
	// Three Runs of MaxArtifacts artifacts and their images at once.
	for i := range 3*schemas.MaxArtifacts + 3 {
		if r := d.Allow("n", "x"); r != nil {
			t.Fatalf("default limit refused request %d of a prepare burst: %v", i, r)
		}
	}
	for i := range pruneAt + 1 {
		d.Allow(fmt.Sprint("p", i), "x")
	}
	now = now.Add(time.Hour)
	d.Allow("last", "x")
	if len(d.nodes) > 2 {
		t.Errorf("%d buckets held after every bucket refilled, want the pruned set", len(d.nodes))
	}
	if (Limit{PerSecond: 0, Burst: 1}).Validate() == nil || (Limit{PerSecond: 1}).Validate() == nil || DefaultLimit.Validate() != nil {
		t.Error("Validate accepts a limit that refuses everything, or refuses the default")
	}
}
