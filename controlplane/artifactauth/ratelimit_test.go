package artifactauth_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestServiceRateLimit: past its burst a node is refused rate_limited,
// told when to ask again, and no grant is written for the refusal; another
// node's bucket is its own; once the indicated delay has passed the node
// is answered again.
func TestServiceRateLimit(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	limit := nodecreds.Limit{PerSecond: 0.01, Burst: 3}
	svc := artifactauth.NewService(w.conn, w.cache, w.nodes, w.runs, w.grants, artifactauth.Config{Limit: limit, Now: clock}, zap.NewNop())
	grants := func() int {
		keys, err := w.grants.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range keys.Keys() {
			n++
		}
		return n
	}
	asA := func() schemas.Reply[schemas.ArtifactCredential] {
		return svc.Answer(ctx, bus.NodeArtifactCredentials("node-a"), req("node-a", 5, digestObj, "run-1"))
	}
	for i := range limit.Burst {
		if rep := asA(); rep.OK == nil || rep.OK.Login == nil {
			t.Fatalf("request %d within the burst: %+v %+v", i+1, rep.OK, rep.Refusal)
		}
	}
	before := grants()
	rep := asA()
	r := rep.Refusal
	if rep.OK != nil || r == nil || r.Code != schemas.CodeRateLimited || r.Field != "node_id" {
		t.Fatalf("request past the burst: %+v %+v, want rate_limited", rep.OK, r)
	}
	if r.RetryAfter() <= 0 || r.RetryAfter() > 101*time.Second {
		t.Errorf("retry after %s, want about 100s at 0.01/s", r.RetryAfter())
	}
	if after := grants(); after != before {
		t.Errorf("a refused request wrote a grant: %d grants, had %d", after, before)
	}
	if rep := svc.Answer(ctx, bus.NodeArtifactCredentials("node-b"), req("node-b", 2, digestURL, "run-3")); rep.OK == nil {
		t.Errorf("node-b's bucket is its own: %+v", rep.Refusal)
	}
	mu.Lock()
	now = now.Add(r.RetryAfter())
	mu.Unlock()
	if rep := asA(); rep.OK == nil {
		t.Errorf("after the indicated delay: %+v, want an answer", rep.Refusal)
	}
	if rep := asA(); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeRateLimited {
		t.Errorf("the bucket refills at its rate, not at once: %+v %+v", rep.OK, rep.Refusal)
	}
}
