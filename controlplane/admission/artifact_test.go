package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestCallout_ArtifactLogin: an artifact login is admitted with a
// grant of wf_artifact_grants only: for its node, unexpired, minted for the
// node's current session, and once, however many logins race with it.
func TestCallout_ArtifactLogin(t *testing.T) {
	sb := startSecuredBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodesKV, _ := sb.cp.JS.KeyValue(ctx, bus.BucketNodes)
	grantsKV, _ := sb.cp.JS.KeyValue(ctx, bus.BucketArtifactGrants)
	now := time.Now()
	for _, rec := range []schemas.NodeRecord{
		{NodeID: "n1", Generation: 1, FencingToken: 1, State: schemas.NodeReady, SessionTokenHash: schemas.TokenHash(newToken()), SessionExpires: now.Add(time.Hour)},
		{NodeID: "n2", Generation: 1, FencingToken: 2, State: schemas.NodeReady, SessionTokenHash: schemas.TokenHash(newToken()), SessionExpires: now.Add(time.Hour)},
		{NodeID: "n3", Generation: 1, FencingToken: 1, State: schemas.NodeLost, SessionTokenHash: schemas.TokenHash(newToken()), SessionExpires: now.Add(-time.Minute)},
	} {
		if _, err := bus.CreateJSON(ctx, nodesKV, rec.NodeID, &rec); err != nil {
			t.Fatal(err)
		}
	}
	grant := func(node string, token uint64, expires time.Time) string {
		t.Helper()
		tok := newToken()
		g := schemas.ArtifactGrant{NodeID: node, FencingToken: token, Digest: "sha256:00", Object: "sha256/00", Consumer: bus.ArtifactConsumer(node, "c1"), ExpiresAt: expires}
		if _, err := bus.CreateJSON(ctx, grantsKV, schemas.ArtifactGrantKey(tok), g); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ok := grant("n1", 1, now.Add(time.Minute))
	if err := sb.login(bus.ArtifactUser("n1"), ok); err != nil {
		t.Fatalf("a granted login: %v", err)
	}
	if err := sb.login(bus.ArtifactUser("n1"), ok); !bus.IsAuthError(err) {
		t.Fatalf("the same token again: %v, want refused", err)
	}
	for _, c := range []struct {
		name, user, secret string
	}{
		{"no grant", bus.ArtifactUser("n1"), newToken()},
		{"another node's grant", bus.ArtifactUser("n2"), grant("n1", 1, now.Add(time.Minute))},
		{"expired grant", bus.ArtifactUser("n1"), grant("n1", 1, now.Add(-time.Second))},
		{"a superseded session's grant", bus.ArtifactUser("n2"), grant("n2", 1, now.Add(time.Minute))},
		{"an expired session", bus.ArtifactUser("n3"), grant("n3", 1, now.Add(time.Minute))},
		{"a malformed user", "n.1@artifact", grant("n1", 1, now.Add(time.Minute))},
		{"not a token", bus.ArtifactUser("n1"), "short"},
	} {
		if err := sb.login(c.user, c.secret); !bus.IsAuthError(err) {
			t.Errorf("%s: %v, want refused", c.name, err)
		}
	}
	// A grant that names no consumer (minted before consumers were the
	// control plane's) gives nothing to read: refused.
	bare := newToken()
	if _, err := bus.CreateJSON(ctx, grantsKV, schemas.ArtifactGrantKey(bare), schemas.ArtifactGrant{NodeID: "n1", FencingToken: 1,
		Digest: "sha256:00", Object: "sha256/00", ExpiresAt: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := sb.login(bus.ArtifactUser("n1"), bare); !bus.IsAuthError(err) {
		t.Errorf("a grant without a consumer: %v, want refused", err)
	}
	// Racing logins with one token: one gets in.
	raced := grant("n1", 1, now.Add(time.Minute))
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if sb.login(bus.ArtifactUser("n1"), raced) == nil {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 1 {
		t.Fatalf("%d racing logins with one token were admitted, want 1", admitted.Load())
	}
}
