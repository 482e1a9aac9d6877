package creds

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// answers plays the control plane: each request gets the next answer, an
// error or a reply written into rep.
type answers struct {
	mu       sync.Mutex
	subjects []string
	reqs     []any
	next     []func(rep any) error
}

func (a *answers) Request(_ context.Context, timeout time.Duration, subject string, req, rep any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if timeout != Timeout {
		return errors.New("asked with another timeout")
	}
	a.subjects, a.reqs = append(a.subjects, subject), append(a.reqs, req)
	f := a.next[0]
	a.next = a.next[1:]
	return f(rep)
}

type asked struct{ answered, unanswered int }

func (m *asked) CredentialAsked(_ time.Duration, answered bool) {
	if answered {
		m.answered++
	} else {
		m.unanswered++
	}
}

func noAnswer(any) error { return nats.ErrNoResponders }

func asker(t *testing.T, ans *answers, m Metrics) *Asker {
	return &Asker{NodeID: "n1", Requester: ans, FencingToken: func() uint64 { return 7 }, Metrics: m, Log: zaptest.NewLogger(t)}
}

// A registry credential is asked under the current session's token, asked
// again while no control plane answers, and counted once per use.
func TestRegistry_AsksUnderTheSessionAndAgainWhenUnanswered(t *testing.T) {
	want := noderuntime.RegistryCredential{Registry: "registry.example", Username: "u", Secret: "p"}
	ans := &answers{next: []func(any) error{noAnswer, func(rep any) error {
		rep.(*schemas.Reply[schemas.RegistryCredential]).OK = &want
		return nil
	}}}
	m := &asked{}
	got, err := asker(t, ans, m).Registry("registry.example/app:1", "r1")(context.Background(), "registry.example")
	if err != nil || got != want {
		t.Fatalf("credential %+v, %v", got, err)
	}
	if len(ans.subjects) != 2 || ans.subjects[1] != bus.NodeRegistryCredentials("n1") {
		t.Fatalf("asked on %v, want twice on %s", ans.subjects, bus.NodeRegistryCredentials("n1"))
	}
	if req := ans.reqs[1].(schemas.RegistryCredentialRequest); req.FencingToken != 7 || req.RunID != "r1" || req.Reference != "registry.example/app:1" {
		t.Errorf("request %+v", req)
	}
	if m.answered != 1 || m.unanswered != 0 {
		t.Errorf("metrics %+v, want one answered ask", m)
	}
}

// A refusal is not asked again; three unanswered asks give up.
func TestRegistry_RefusedOrUnanswered(t *testing.T) {
	ans := &answers{next: []func(any) error{func(rep any) error {
		rep.(*schemas.Reply[schemas.RegistryCredential]).Refusal = &schemas.Refusal{Code: schemas.CodeRunNotFound, Reason: "not booked"}
		return nil
	}}}
	m := &asked{}
	if _, err := asker(t, ans, m).Registry("r/app:1", "r1")(context.Background(), "r"); err == nil || len(ans.subjects) != 1 {
		t.Fatalf("refused: %v after %d asks", err, len(ans.subjects))
	}
	ans = &answers{next: []func(any) error{noAnswer, noAnswer, noAnswer}}
	_, err := asker(t, ans, m).Registry("r/app:1", "r1")(context.Background(), "r")
	if !errors.Is(err, nats.ErrNoResponders) || len(ans.subjects) != tries {
		t.Fatalf("unanswered: %v after %d asks, want %d", err, len(ans.subjects), tries)
	}
	if m.unanswered != 2 {
		t.Errorf("metrics %+v, want two unanswered uses", m)
	}
}

// An artifact's credential that is refused, unanswered or for another
// artifact is an ArtifactCredentialError, coded source auth failed.
func TestArtifact_Errors(t *testing.T) {
	digest := "sha256:aa"
	for name, answer := range map[string]func(any) error{
		"refused": func(rep any) error {
			rep.(*schemas.Reply[schemas.ArtifactCredential]).Refusal = &schemas.Refusal{Code: schemas.CodeRunNotFound, Reason: "not booked"}
			return nil
		},
		"another artifact's": func(rep any) error {
			rep.(*schemas.Reply[schemas.ArtifactCredential]).OK = &schemas.ArtifactCredential{Digest: "sha256:bb"}
			return nil
		},
		"broken": func(any) error { return errors.New("connection closed") },
	} {
		ans := &answers{next: []func(any) error{answer}}
		_, err := asker(t, ans, nil).Artifact(context.Background(), digest, "r1", "", 0)
		var ce *ArtifactCredentialError
		if !errors.As(err, &ce) || ce.Digest != digest || ce.Code() != schemas.CodeArtifactSourceAuthFailed {
			t.Errorf("%s: %v", name, err)
		}
	}
	ans := &answers{next: []func(any) error{func(rep any) error {
		rep.(*schemas.Reply[schemas.ArtifactCredential]).OK = &schemas.ArtifactCredential{Digest: digest, Headers: map[string]string{"Authorization": "x"}}
		return nil
	}}}
	cred, err := asker(t, ans, nil).Artifact(context.Background(), digest, "", "pf-1", 0)
	if err != nil || cred.Headers["Authorization"] != "x" {
		t.Fatalf("credential %+v, %v", cred, err)
	}
	if req := ans.reqs[0].(schemas.ArtifactCredentialRequest); req.PrefetchID != "pf-1" || req.FencingToken != 7 || ans.subjects[0] != bus.NodeArtifactCredentials("n1") {
		t.Errorf("request %+v on %s", req, ans.subjects[0])
	}
}

// A rate_limited refusal is not the use's failure: the asker waits the
// delay the control plane named and asks again, and a context that ends
// while it waits ends the ask.
func TestArtifact_RateLimitedWaitsAndAsksAgain(t *testing.T) {
	digest := "sha256:aa"
	limited := func(rep any) error {
		rep.(*schemas.Reply[schemas.ArtifactCredential]).Refusal = &schemas.Refusal{Code: schemas.CodeRateLimited, Field: "node_id",
			Reason: "node n1 asked too often", RetryAfterMillis: 150}
		return nil
	}
	ans := &answers{next: []func(any) error{limited, limited, func(rep any) error {
		rep.(*schemas.Reply[schemas.ArtifactCredential]).OK = &schemas.ArtifactCredential{Digest: digest}
		return nil
	}}}
	start := time.Now()
	if _, err := asker(t, ans, nil).Artifact(context.Background(), digest, "r1", "", 0); err != nil {
		t.Fatalf("rate limited twice, then answered: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond || len(ans.subjects) != 3 {
		t.Errorf("asked %d times in %s, want 3 asks at least 300ms apart in all", len(ans.subjects), took)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	long := func(rep any) error {
		rep.(*schemas.Reply[schemas.ArtifactCredential]).Refusal = &schemas.Refusal{Code: schemas.CodeRateLimited, RetryAfterMillis: 60_000}
		return nil
	}
	ans = &answers{next: []func(any) error{long}}
	start = time.Now()
	_, err := asker(t, ans, nil).Artifact(ctx, digest, "r1", "", 0)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("context ended while waiting: %v after %s", err, time.Since(start))
	}
}
