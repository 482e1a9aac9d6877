package secretauth_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/secretauth"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestServiceAnswers: the node's current session gets the values of the
// secrets of an attempt booked on it now, from the Run's tenant, in the
// Run's order; another node, an old session, a lapsed lease, an attempt
// not booked there (finished, superseded, another node's), a secret
// removed since intake and a node past its rate limit are refused with
// their codes; no log line holds a value.
func TestServiceAnswers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	conn := testenv.ProvisionedBus(t, "cp")
	var kvs []jetstream.KeyValue
	for _, b := range []string{bus.BucketNodes, bus.BucketRuns, bus.BucketResidency} {
		h, err := conn.JS.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		kvs = append(kvs, h)
	}
	nodes, runs, residency := kvs[0], kvs[1], kvs[2]
	now := time.Now()
	for _, n := range []schemas.NodeRecord{
		{NodeID: "node-a", FencingToken: 5, State: schemas.NodeReady, LeaseExpires: now.Add(time.Hour)},
		{NodeID: "node-b", FencingToken: 2, State: schemas.NodeReady, LeaseExpires: now.Add(time.Hour)},
		{NodeID: "node-c", FencingToken: 3, State: schemas.NodeLost, LeaseExpires: now.Add(-time.Minute)},
	} {
		if _, err := bus.CreateJSON(ctx, nodes, n.NodeID, n); err != nil {
			t.Fatal(err)
		}
	}
	refs := schemas.RunRequest{SecretEnv: []schemas.SecretEnvRef{{Name: "API_TOKEN", Secret: "api"}},
		SecretFiles: []schemas.SecretFileRef{{Secret: "tls", Path: "/run/secrets/tls.key"}, {Secret: "api", Path: "/etc/api", Mode: 0o440}}}
	gone := schemas.RunRequest{SecretEnv: []schemas.SecretEnvRef{{Name: "X", Secret: "removed"}}}
	for _, r := range []schemas.Run{
		{ID: "run-1", AttemptID: "run-1.2", Phase: schemas.PhaseLaunching, NodeID: "node-a", Request: refs},
		{ID: "run-2", AttemptID: "run-2.1", Phase: schemas.PhaseSucceeded, NodeID: "node-a", Request: refs},
		{ID: "run-3", AttemptID: "run-3.1", Phase: schemas.PhaseLaunching, NodeID: "node-b", Tenant: "acme", Request: refs},
		{ID: "run-4", AttemptID: "run-4.1", Phase: schemas.PhaseRunning, NodeID: "node-c", Request: refs},
		{ID: "run-5", AttemptID: "run-5.1", Phase: schemas.PhaseLaunching, NodeID: "node-a", Request: gone},
	} {
		if _, err := bus.CreateJSON(ctx, runs, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	keyPath := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := secrets.EnsureKeyFile(keyPath); err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.LoadKeyFile(keyPath, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	store, err := secrets.OpenStore(ctx, conn.JS, keys, []string{"acme"}, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	values := map[string][]byte{}
	for _, s := range []struct{ tenant, name string }{{schemas.DefaultTenant, "api"}, {schemas.DefaultTenant, "tls"}, {schemas.DefaultTenant, "removed"},
		{"acme", "api"}, {"acme", "tls"}} {
		values[s.tenant+"/"+s.name] = []byte(fmt.Sprintf("value-of-%s-%s-9f86d081884c", s.tenant, s.name))
		if _, err := store.Set(ctx, s.tenant, s.name, values[s.tenant+"/"+s.name]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Remove(ctx, schemas.DefaultTenant, "removed"); err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	if err := c.Start(ctx, &wg, runs, nodes, residency, log); err != nil {
		t.Fatal(err)
	}
	svc := secretauth.NewService(conn, c, nodes, runs, store,
		nodecreds.Limit{PerSecond: 0.001, Burst: 8}, time.Now, log)
	stop, err := svc.Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	agentConn := testenv.Dial(t, conn.NC.ConnectedUrl(), "node")
	ask := func(subjectNode string, req schemas.SecretRequest) schemas.Reply[schemas.SecretValues] {
		t.Helper()
		b, err := codec.Encode(codec.MsgPack, req)
		if err != nil {
			t.Fatal(err)
		}
		m, err := agentConn.NC.Request(bus.NodeSecretCredentials(subjectNode), b, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep schemas.Reply[schemas.SecretValues]
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	req := func(node string, token uint64, run, attempt string) schemas.SecretRequest {
		return schemas.SecretRequest{NodeID: node, FencingToken: token, RunID: run, AttemptID: attempt}
	}

	// The booked attempt: its tenant's values, in order.
	for _, tc := range []struct {
		node    string
		token   uint64
		run     string
		attempt string
		tenant  string
	}{{"node-a", 5, "run-1", "run-1.2", schemas.DefaultTenant}, {"node-b", 2, "run-3", "run-3.1", "acme"}} {
		rep := ask(tc.node, req(tc.node, tc.token, tc.run, tc.attempt))
		v := rep.OK
		if v == nil || rep.Refusal != nil {
			t.Fatalf("%s: refused %+v", tc.run, rep.Refusal)
		}
		if len(v.Env) != 1 || v.Env[0].Name != "API_TOKEN" || !bytes.Equal(v.Env[0].Value, values[tc.tenant+"/api"]) ||
			len(v.Files) != 2 || v.Files[0].Path != "/run/secrets/tls.key" || v.Files[0].Mode != 0o400 || !bytes.Equal(v.Files[0].Value, values[tc.tenant+"/tls"]) ||
			v.Files[1].Path != "/etc/api" || v.Files[1].Mode != 0o440 || !bytes.Equal(v.Files[1].Value, values[tc.tenant+"/api"]) {
			t.Fatalf("%s: answered %v", tc.run, v)
		}
	}
	for _, tc := range []struct {
		name    string
		subject string
		req     schemas.SecretRequest
		code    schemas.Code
		field   string
	}{
		{"another node's subject", "node-b", req("node-a", 5, "run-1", "run-1.2"), schemas.CodeWrongNode, "node_id"},
		{"an old session", "node-a", req("node-a", 4, "run-1", "run-1.2"), schemas.CodeStaleFencingToken, "fencing_token"},
		{"a lapsed lease", "node-c", req("node-c", 3, "run-4", "run-4.1"), schemas.CodeSessionExpired, ""},
		{"another node's attempt", "node-a", req("node-a", 5, "run-3", "run-3.1"), schemas.CodeNotBookedHere, "attempt_id"},
		{"a superseded attempt", "node-a", req("node-a", 5, "run-1", "run-1.1"), schemas.CodeNotBookedHere, "attempt_id"},
		{"a finished Run", "node-a", req("node-a", 5, "run-2", "run-2.1"), schemas.CodeNotBookedHere, "attempt_id"},
		{"a secret removed since intake", "node-a", req("node-a", 5, "run-5", "run-5.1"), schemas.CodeSecretUnknown, "secret_env[0].secret"},
		{"an unknown Run", "node-a", req("node-a", 5, "run-9", "run-9.1"), schemas.CodeNotBookedHere, "attempt_id"},
	} {
		rep := ask(tc.subject, tc.req)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != tc.code || rep.Refusal.Field != tc.field {
			t.Errorf("%s: %v %+v, want %s on %q", tc.name, rep.OK, rep.Refusal, tc.code, tc.field)
		}
	}
	// node-a has asked 6 times within its burst of 8 (refusals before
	// the limit take nothing); two more pass, the next is limited.
	var limited *schemas.Refusal
	for range 4 {
		if rep := ask("node-a", req("node-a", 5, "run-1", "run-1.2")); rep.Refusal != nil {
			limited = rep.Refusal
			break
		}
	}
	if limited == nil || limited.Code != schemas.CodeRateLimited || limited.RetryAfter() <= 0 {
		t.Fatalf("past its burst: %+v, want rate_limited", limited)
	}
	if svc.Given() < 3 || svc.Refused() < 9 {
		t.Errorf("given %d, refused %d", svc.Given(), svc.Refused())
	}

	for _, e := range logs.All() {
		text := e.Message + " " + fmt.Sprint(e.ContextMap())
		for name, v := range values {
			if strings.Contains(text, string(v)) || strings.Contains(text, base64.StdEncoding.EncodeToString(v)) {
				t.Errorf("log line %q holds the value of %s", e.Message, name)
			}
		}
	}
	if len(logs.FilterMessage("secret request refused").All()) < 8 {
		t.Errorf("refusals not logged: %d lines", logs.Len())
	}
}
