package admission

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// logLogin dials as the log connection of node for run. Async errors
// (permission violations) arrive on the channel.
func (sb *securedBus) logLogin(t *testing.T, node, run, secret string) (*bus.Conn, <-chan error, error) {
	t.Helper()
	errs := make(chan error, 16)
	opts := append(bus.NodeLogCredentials(node, run, secret).Options(),
		nats.RetryOnFailedConnect(false),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	c, err := bus.Connect(sb.url, "log test", zaptest.NewLogger(t), opts...)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(c.Close)
	return c, errs, nil
}

// wantViolation waits for the permissions violation naming subject.
func wantViolation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if bus.IsAuthError(err) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
			t.Logf("other async error: %v", err)
		case <-deadline:
			t.Fatalf("no permissions violation for %s", subject)
		}
	}
}

// TestCallout_RunLogLogin: an agent's log login for a Run is admitted
// only with the node's live session token and only while the Run's current
// attempt is booked on that node; it may publish that Run's output to
// WF_LOGS and nothing else.
func TestCallout_RunLogLogin(t *testing.T) {
	sb := startSecuredBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodesKV, _ := sb.cp.JS.KeyValue(ctx, bus.BucketNodes)
	runsKV, _ := sb.cp.JS.KeyValue(ctx, bus.BucketRuns)
	session, otherSession, expiredSession := newToken(), newToken(), newToken()
	for _, rec := range []schemas.NodeRecord{
		{NodeID: "n1", Generation: 1, FencingToken: 1, State: schemas.NodeReady, SessionTokenHash: schemas.TokenHash(session), SessionExpires: time.Now().Add(time.Hour)},
		{NodeID: "n2", Generation: 1, FencingToken: 1, State: schemas.NodeReady, SessionTokenHash: schemas.TokenHash(otherSession), SessionExpires: time.Now().Add(time.Hour)},
		{NodeID: "n3", Generation: 1, FencingToken: 1, State: schemas.NodeLost, SessionTokenHash: schemas.TokenHash(expiredSession), SessionExpires: time.Now().Add(-time.Minute)},
	} {
		if _, err := bus.CreateJSON(ctx, nodesKV, rec.NodeID, &rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range []schemas.Run{
		{ID: "r1", Phase: schemas.PhaseRunning, Attempt: 1, NodeID: "n1", AttemptID: schemas.WorkloadID("r1", 1)},
		{ID: "r2", Phase: schemas.PhaseRunning, Attempt: 2, NodeID: "n2", AttemptID: schemas.WorkloadID("r2", 2)},
		{ID: "r3", Tenant: "acme", Phase: schemas.PhaseSucceeded, Attempt: 1, NodeID: "n1", AttemptID: schemas.WorkloadID("r3", 1)},
		{ID: "r4", Phase: schemas.PhaseAccepted, Attempt: 2},
		{ID: "r5", Phase: schemas.PhaseRunning, Attempt: 1, NodeID: "n3"},
	} {
		if _, err := bus.CreateJSON(ctx, runsKV, run.ID, &run); err != nil {
			t.Fatal(err)
		}
	}

	c, errs, err := sb.logLogin(t, "n1", "r1", session)
	if err != nil {
		t.Fatalf("log login of n1 for its Run r1: %v", err)
	}
	ack, err := c.JS.Publish(ctx, bus.RunLogsSubject(schemas.DefaultTenant, "r1"), []byte("hello\n"), jetstream.WithMsgID(bus.LogMsgID("r1-a1", bus.LogStdout, 0)))
	if err != nil || ack.Stream != bus.StreamLogs {
		t.Fatalf("publish r1's output: %+v %v", ack, err)
	}
	// Another Run's output, the node's own observations: dropped.
	for _, subj := range []string{bus.RunLogsSubject(schemas.DefaultTenant, "r2"), bus.NodeObs("n1")} {
		if err := c.NC.Publish(subj, []byte("forged\n")); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subj)
	}
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, err := c.JS.Publish(pctx, bus.RunLogsSubject(schemas.DefaultTenant, "r2"), []byte("forged\n")); err == nil {
		t.Fatal("JetStream publish to r2's output acked")
	}
	pcancel()
	wantViolation(t, errs, bus.RunLogsSubject(schemas.DefaultTenant, "r2"))
	if _, err := c.NC.SubscribeSync(bus.SubjectLogsAll); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, errs, bus.SubjectLogsAll)
	logs, err := sb.cp.JS.Stream(ctx, bus.StreamLogs)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := logs.GetLastMsgForSubject(ctx, bus.RunLogsSubject(schemas.DefaultTenant, "r2")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("r2's output holds %v (%v)", m, err)
	}
	if m, err := logs.GetLastMsgForSubject(ctx, bus.RunLogsSubject(schemas.DefaultTenant, "r1")); err != nil || string(m.Data) != "hello\n" {
		t.Fatalf("r1's output: %v %v", m, err)
	}

	// A finished attempt's tail may still be shipped, on the subject of
	// the Run's tenant only.
	c3, errs3, err := sb.logLogin(t, "n1", "r3", session)
	if err != nil {
		t.Fatalf("log login of n1 for its finished Run r3: %v", err)
	}
	if _, err := c3.JS.Publish(ctx, bus.RunLogsSubject("acme", "r3"), []byte("tail\n")); err != nil {
		t.Fatalf("publish r3's tail: %v", err)
	}
	if err := c3.NC.Publish(bus.RunLogsSubject(schemas.DefaultTenant, "r3"), []byte("forged\n")); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, errs3, bus.RunLogsSubject(schemas.DefaultTenant, "r3"))

	for _, tc := range []struct {
		name, node, run, secret, reason string
	}{
		{"run booked on another node", "n1", "r2", session, "booked on node n2, not n1"},
		{"run booked on no node", "n1", "r4", session, "booked on no node"},
		{"unknown run", "n1", "r-none", session, "no Run r-none"},
		{"wrong token", "n1", "r1", newToken(), "not the current session token of node n1"},
		{"another node's token", "n1", "r1", otherSession, "not the current session token of node n1"},
		{"expired session", "n3", "r5", expiredSession, "session expired"},
		{"not a token", "n1", "r1", "guessed-password", "not a warmfleet token"},
		{"dotted run id", "n1", "r1.>", session, "<node id>/<run id>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if bus.SubjectToken(tc.run) {
				_, _, err = sb.logLogin(t, tc.node, tc.run, tc.secret)
			} else {
				// No inbox prefix: nats.go refuses one with a wildcard.
				var nc *nats.Conn
				if nc, err = nats.Connect(sb.url, nats.UserInfo(bus.NodeLogUser(tc.node, tc.run), tc.secret)); err == nil {
					nc.Close()
				}
			}
			if !bus.IsAuthError(err) {
				t.Fatalf("login: %v, want a refusal", err)
			}
			_, err = sb.callout.authorize(ctx, jwt.ConnectOptions{Username: bus.NodeLogUser(tc.node, tc.run), Password: tc.secret})
			var ref *Refusal
			if !errors.As(err, &ref) || !strings.Contains(ref.Reason, tc.reason) {
				t.Fatalf("refusal %v, want one saying %q", err, tc.reason)
			}
			if strings.Contains(err.Error(), tc.secret) {
				t.Fatalf("the refusal echoes the secret: %v", err)
			}
		})
	}
}
