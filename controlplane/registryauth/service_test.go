package registryauth_test

import (
	"context"
	"fmt"
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
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	// The registry password the service must hand out and never log.
	servicePassword = "Service-Secret-c0ffee"
)

// TestServiceAuthorization asks over NATS as nodes do and checks who gets
// a credential: only a node's current, live session, only for an image it
// has a live booking (or another wanted reason, the prefetch seam) for.
// A registry the control plane holds nothing for is answered anonymous; a
// failing helper is a coded refusal without its output; nothing logged
// holds the password.
func TestServiceAuthorization(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	conn := testenv.ProvisionedBus(t, "cp")
	var buckets []jetstream.KeyValue
	for _, b := range []string{bus.BucketNodes, bus.BucketRuns, bus.BucketResidency} {
		h, err := conn.JS.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		buckets = append(buckets, h)
	}
	nodes, runsBucket, residency := buckets[0], buckets[1], buckets[2]

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
	private := "registry.example.com/team/app@" + digestA
	done := "registry.example.com/team/old@" + digestB
	public := "public.example.com/tools@" + digestA
	prefetched := "registry.example.com/team/warm@" + digestB
	broken := "broken.example.com/app@" + digestA
	for _, r := range []schemas.Run{
		// A tag beside the digest is still the booked image.
		{ID: "run-1", Phase: schemas.PhaseRunning, NodeID: "node-a", Request: schemas.RunRequest{Image: "registry.example.com/team/app:v1@" + digestA}},
		{ID: "run-2", Phase: schemas.PhaseSucceeded, NodeID: "node-a", Request: schemas.RunRequest{Image: done}},
		{ID: "run-3", Phase: schemas.PhasePlaced, Queued: true, NodeID: "node-b", Request: schemas.RunRequest{Image: public}},
		{ID: "run-4", Phase: schemas.PhasePreparing, NodeID: "node-b", Request: schemas.RunRequest{Image: broken}},
		{ID: "run-5", Phase: schemas.PhaseRunning, NodeID: "node-c", Request: schemas.RunRequest{Image: private}},
	} {
		if _, err := bus.CreateJSON(ctx, runsBucket, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	c := cache.New()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	if err := c.Start(ctx, &wg, runsBucket, nodes, residency, log); err != nil {
		t.Fatal(err)
	}

	installHelpers(t, map[string]string{"broken": `echo "` + servicePassword + `"; exit 1`})
	file, err := registryauth.ParseConfig([]byte(`{"auths": {"registry.example.com": {"username": "robot", "password": "` + servicePassword + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	src, err := registryauth.NewSource(file, map[string]string{"broken.example.com": "broken"}, registryauth.HelperRunner{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The prefetch seam: another reason a node may want an image.
	prefetch := func(nodeID string, ref schemas.ImageRef) []string {
		if nodeID == "node-b" && ref.String() == prefetched {
			return []string{schemas.DefaultTenant}
		}
		return nil
	}
	svc := registryauth.NewService(conn, c, nodes, runsBucket, src,
		[]registryauth.ImageWanted{registryauth.BookedImages(c), prefetch}, nodecreds.Limit{}, time.Now, log)
	stop, err := svc.Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	agentConn := testenv.Dial(t, conn.NC.ConnectedUrl(), "node")
	ask := func(subjectNode string, body any) schemas.Reply[schemas.RegistryCredential] {
		t.Helper()
		b, err := codec.Encode(codec.MsgPack, body)
		if err != nil {
			t.Fatal(err)
		}
		m, err := agentConn.NC.Request(bus.NodeRegistryCredentials(subjectNode), b, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep schemas.Reply[schemas.RegistryCredential]
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	req := func(node string, token uint64, ref string) schemas.RegistryCredentialRequest {
		return schemas.RegistryCredentialRequest{NodeID: node, FencingToken: token, Reference: ref}
	}
	// The cache catches up with the records written above.
	deadline := time.Now().Add(10 * time.Second)
	for rep := ask("node-a", req("node-a", 5, private)); rep.OK == nil; rep = ask("node-a", req("node-a", 5, private)) {
		if time.Now().After(deadline) {
			t.Fatalf("node-a's booked image: %+v", rep.Refusal)
		}
		time.Sleep(50 * time.Millisecond)
	}

	rep := ask("node-a", req("node-a", 5, private))
	if ok := rep.OK; ok == nil || ok.Registry != "registry.example.com" || ok.Username != "robot" || ok.Secret != servicePassword || ok.Anonymous {
		t.Fatalf("booked image: %+v %+v", rep.OK, rep.Refusal)
	}
	rep = ask("node-b", req("node-b", 2, public))
	if ok := rep.OK; ok == nil || !ok.Anonymous || ok.Secret != "" || ok.Registry != "public.example.com" {
		t.Fatalf("a registry without credentials: %+v %+v, want anonymous", rep.OK, rep.Refusal)
	}
	rep = ask("node-b", req("node-b", 2, prefetched))
	if rep.OK == nil || rep.OK.Secret != servicePassword {
		t.Fatalf("prefetched image: %+v %+v", rep.OK, rep.Refusal)
	}

	for _, c := range []struct {
		name    string
		subject string
		body    any
		code    schemas.Code
	}{
		{"stale session", "node-a", req("node-a", 4, private), schemas.CodeStaleFencingToken},
		{"newer token than the registry's", "node-a", req("node-a", 6, private), schemas.CodeStaleFencingToken},
		{"another node's booking", "node-b", req("node-b", 2, private), schemas.CodeImageNotWanted},
		{"a finished Run's image", "node-a", req("node-a", 5, done), schemas.CodeImageNotWanted},
		{"an image never booked", "node-a", req("node-a", 5, "registry.example.com/other@"+digestA), schemas.CodeImageNotWanted},
		{"on another node's subject", "node-b", req("node-a", 5, private), schemas.CodeWrongNode},
		{"lapsed lease", "node-c", req("node-c", 3, private), schemas.CodeSessionExpired},
		{"unknown node", "node-z", req("node-z", 1, private), schemas.CodeUnknownNode},
		{"helper fails", "node-b", req("node-b", 2, broken), schemas.CodeCredentialUnavailable},
		{"not pinned", "node-a", req("node-a", 5, "registry.example.com/team/app:v1"), schemas.CodeImageNotPinned},
		{"malformed", "node-a", map[string]any{"node_id": 7}, schemas.CodeMalformed},
	} {
		rep := ask(c.subject, c.body)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code {
			t.Errorf("%s: %+v %+v, want refusal %s", c.name, rep.OK, rep.Refusal, c.code)
			continue
		}
		if strings.Contains(rep.Refusal.Error(), servicePassword) {
			t.Errorf("%s: the refusal holds the password: %v", c.name, rep.Refusal)
		}
	}
	// One more given: the first ask of the wait above.
	if svc.Given() != 4 || svc.Refused() < 11 {
		t.Errorf("given %d, refused %d", svc.Given(), svc.Refused())
	}
	if logs.FilterMessage("registry credential refused").Len() < 11 || logs.FilterMessage("registry credential source failed").Len() != 1 {
		t.Errorf("refusals and the helper failure are not all logged")
	}
	// A replica whose cache has seen none of it yet (never started here):
	// the node is read from wf_nodes, and the booking from wf_runs when the
	// request names its Run.
	cold := registryauth.NewService(conn, cache.New(), nodes, runsBucket, src, []registryauth.ImageWanted{registryauth.BookedImages(cache.New())}, nodecreds.Limit{}, time.Now, log)
	withRun := req("node-a", 5, private)
	withRun.RunID = "run-1"
	if rep := cold.Answer(ctx, bus.NodeRegistryCredentials("node-a"), withRun); rep.OK == nil || rep.OK.Secret != servicePassword {
		t.Errorf("cold replica, Run named: %+v %+v", rep.OK, rep.Refusal)
	}
	if rep := cold.Answer(ctx, bus.NodeRegistryCredentials("node-a"), req("node-a", 5, private)); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeImageNotWanted {
		t.Errorf("cold replica, no Run named: %+v %+v", rep.OK, rep.Refusal)
	}
	otherRun := req("node-b", 2, private)
	otherRun.RunID = "run-1" // node-a's
	if rep := cold.Answer(ctx, bus.NodeRegistryCredentials("node-b"), otherRun); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeImageNotWanted {
		t.Errorf("cold replica, another node's Run named: %+v %+v", rep.OK, rep.Refusal)
	}
	// Past its burst a node is refused rate_limited with the wait, before
	// the credential helper runs again.
	limited := registryauth.NewService(conn, c, nodes, runsBucket, src, []registryauth.ImageWanted{registryauth.BookedImages(c)},
		nodecreds.Limit{PerSecond: 0.01, Burst: 1}, time.Now, log)
	helperRuns := func() int { return logs.FilterMessage("registry credential source failed").Len() }
	before := helperRuns()
	if rep := limited.Answer(ctx, bus.NodeRegistryCredentials("node-b"), req("node-b", 2, broken)); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeCredentialUnavailable {
		t.Errorf("within the burst: %+v %+v, want the helper's failure", rep.OK, rep.Refusal)
	}
	past := limited.Answer(ctx, bus.NodeRegistryCredentials("node-b"), req("node-b", 2, broken))
	if r := past.Refusal; r == nil || r.Code != schemas.CodeRateLimited || r.RetryAfter() <= 0 || !strings.Contains(r.Reason, "registry credentials") {
		t.Errorf("past the burst: %+v %+v, want rate_limited with a wait", past.OK, past.Refusal)
	}
	if helperRuns() != before+1 {
		t.Errorf("the helper ran %d times for two asks, one refused rate_limited; want 1", helperRuns()-before)
	}
	if rep := limited.Answer(ctx, bus.NodeRegistryCredentials("node-a"), req("node-a", 5, private)); rep.OK == nil {
		t.Errorf("another node's bucket is its own: %+v", rep.Refusal)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, servicePassword) || strings.Contains(fieldsText(e), servicePassword) {
			t.Fatalf("a log line holds the password: %s %v", e.Message, e.ContextMap())
		}
	}
}

func fieldsText(e observer.LoggedEntry) string { return fmt.Sprint(e.ContextMap()) }
