package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/schemas"
)

func sessionToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// sessionHash is a session token as wf_nodes holds it.
func sessionHash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return "sha256:" + hex.EncodeToString(s[:])
}

// TestLogDialer: against a TLS server with the real auth callout, the
// per-Run log connection logs in with the session token the agent's
// credentials hold at dial time, publishes its Run's output to WF_LOGS,
// and is refused for a Run booked on another node.
func TestLogDialer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := zaptest.NewLogger(t)
	pki, err := bus.GenerateDevPKI(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := issuer.Seed()
	pub, _ := issuer.PublicKey()
	password := sessionToken(t)
	srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir(), Port: -1, TLS: pki.Server(true),
		Auth: &bus.EmbeddedAuth{ServiceUser: "warmfleet-cp", ServicePassword: password, Issuer: pub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	tlsOpts, err := pki.Client().ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := bus.Connect(srv.URL(), "warmfleet-cp", log, append(tlsOpts, nats.UserInfo("warmfleet-cp", password))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if err := cp.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, cp.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	callout, err := admission.New(ctx, cp, admission.Config{IssuerSeed: seed}, log)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := callout.Serve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for srv.Server().GlobalAccount().Interest(bus.AuthCalloutSubject) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the auth callout did not subscribe")
		}
		time.Sleep(10 * time.Millisecond)
	}

	nodesKV, _ := cp.JS.KeyValue(ctx, bus.BucketNodes)
	runsKV, _ := cp.JS.KeyValue(ctx, bus.BucketRuns)
	oldSession, session := sessionToken(t), sessionToken(t)
	rec := schemas.NodeRecord{NodeID: "gpu-1", Generation: 1, FencingToken: 1, State: schemas.NodeReady,
		SessionTokenHash: sessionHash(session), SessionExpires: time.Now().Add(time.Hour)}
	if _, err := bus.CreateJSON(ctx, nodesKV, rec.NodeID, &rec); err != nil {
		t.Fatal(err)
	}
	for _, run := range []schemas.Run{
		{ID: "r-mine", Phase: schemas.PhaseRunning, Attempt: 1, NodeID: "gpu-1"},
		{ID: "r-theirs", Phase: schemas.PhaseRunning, Attempt: 1, NodeID: "gpu-2"},
	} {
		if _, err := bus.CreateJSON(ctx, runsKV, run.ID, &run); err != nil {
			t.Fatal(err)
		}
	}

	creds := bus.NodeCredentials("gpu-1", oldSession)
	dial := newLogDialer(srv.URL(), "gpu-1", pki.Client(), creds, log)
	if _, _, err := dial(ctx, "r-mine"); !bus.IsAuthError(err) {
		t.Fatalf("dial with a superseded session: %v, want a refusal", err)
	}
	creds.SetSecret(session) // as the agent does after enrolling
	js, closeConn, err := dial(ctx, "r-mine")
	if err != nil {
		t.Fatalf("dial r-mine: %v", err)
	}
	if ack, err := js.Publish(ctx, bus.RunLogsSubject(schemas.DefaultTenant, "r-mine"), []byte("hello\n")); err != nil || ack.Stream != bus.StreamLogs {
		t.Fatalf("publish: %+v %v", ack, err)
	}
	closeConn()
	closeConn()
	if _, err := js.Publish(ctx, bus.RunLogsSubject(schemas.DefaultTenant, "r-mine"), []byte("late\n")); err == nil {
		t.Fatal("publish after close succeeded")
	}
	if _, _, err := dial(ctx, "r-theirs"); !bus.IsAuthError(err) {
		t.Fatalf("dial a Run booked on another node: %v, want a refusal", err)
	}
	if newLogDialer(srv.URL(), "gpu-1", pki.Client(), nil, log) != nil {
		t.Fatal("a log dialer without --nats-auth")
	}
}
