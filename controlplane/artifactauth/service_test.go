package artifactauth_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

var (
	digestObj  = "sha256:" + strings.Repeat("a", 64)
	digestURL  = "sha256:" + strings.Repeat("b", 64)
	digestDone = "sha256:" + strings.Repeat("c", 64)
	digestPre  = "sha256:" + strings.Repeat("d", 64)
	digestNone = "sha256:" + strings.Repeat("e", 64)
	digestGone = "sha256:" + strings.Repeat("f", 64)
	// objectSize is three chunks of the object digestObj's mounts name.
	objectSize = 2*bus.ObjectChunkSize + 7
)

type world struct {
	conn                *bus.Conn
	nodes, runs, grants jetstream.KeyValue
	cache               *cache.Cache
	svc                 *artifactauth.Service
	logs                *observer.ObservedLogs
}

// newWorld provisions a bus with node-a (token 5, live), node-b (token 2,
// live) and node-c (lapsed), and Runs booked on them, and starts the
// service over a started cache.
func newWorld(t testing.TB) *world {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	w := &world{conn: testenv.ProvisionedBus(t, "cp")}
	var kvs []jetstream.KeyValue
	for _, b := range []string{bus.BucketNodes, bus.BucketRuns, bus.BucketResidency, bus.BucketArtifactGrants} {
		h, err := w.conn.JS.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		kvs = append(kvs, h)
	}
	w.nodes, w.runs, w.grants = kvs[0], kvs[1], kvs[3]
	now := time.Now()
	for _, n := range []schemas.NodeRecord{
		{NodeID: "node-a", FencingToken: 5, State: schemas.NodeReady, LeaseExpires: now.Add(time.Hour)},
		{NodeID: "node-b", FencingToken: 2, State: schemas.NodeReady, LeaseExpires: now.Add(time.Hour)},
		{NodeID: "node-c", FencingToken: 3, State: schemas.NodeLost, LeaseExpires: now.Add(-time.Minute)},
	} {
		if _, err := bus.CreateJSON(ctx, w.nodes, n.NodeID, n); err != nil {
			t.Fatal(err)
		}
	}
	mount := func(d string, src schemas.ArtifactSource) schemas.ArtifactMount {
		return schemas.ArtifactMount{Name: "m", Version: "v1", Digest: d, Source: src, Path: "/m/" + d[7:15]}
	}
	obj := schemas.ArtifactSource{Object: "sha256/" + strings.Repeat("a", 64)}
	for _, r := range []schemas.Run{
		{ID: "run-1", Phase: schemas.PhaseRunning, NodeID: "node-a", Artifacts: []schemas.ArtifactMount{mount(digestObj, obj),
			mount(digestURL, schemas.ArtifactSource{URL: "https://models.example.com/m/v1"})}},
		{ID: "run-2", Phase: schemas.PhaseSucceeded, NodeID: "node-a", Artifacts: []schemas.ArtifactMount{mount(digestDone, obj)}},
		{ID: "run-3", Phase: schemas.PhasePlaced, Queued: true, NodeID: "node-b", Artifacts: []schemas.ArtifactMount{mount(digestURL, schemas.ArtifactSource{URL: "https://anon.example.com/m"})}},
		{ID: "run-5", Phase: schemas.PhaseRunning, NodeID: "node-c", Artifacts: []schemas.ArtifactMount{mount(digestObj, obj)}},
		{ID: "run-6", Phase: schemas.PhaseRunning, NodeID: "node-a", Artifacts: []schemas.ArtifactMount{
			mount(digestGone, schemas.ArtifactSource{Object: "sha256/" + strings.Repeat("f", 64)})}},
	} {
		if _, err := bus.CreateJSON(ctx, w.runs, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	store, err := w.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(ctx, obj.Object, make([]byte, objectSize)); err != nil {
		t.Fatal(err)
	}
	w.cache = cache.New()
	core, logs := observer.New(zapcore.DebugLevel)
	w.logs = logs
	log := zap.New(core)
	if err := w.cache.Start(ctx, &wg, w.runs, w.nodes, kvs[2], log); err != nil {
		t.Fatal(err)
	}
	urls, err := artifactauth.ParseURLSource("https://models.example.com/ Authorization: " + headerSecret + "\n")
	if err != nil {
		t.Fatal(err)
	}
	prefetch := func(nodeID, digest string) (schemas.ArtifactSource, bool) {
		return schemas.ArtifactSource{URL: "https://models.example.com/pre"}, nodeID == "node-b" && digest == digestPre
	}
	w.svc = artifactauth.NewService(w.conn, w.cache, w.nodes, w.runs, w.grants, artifactauth.Config{URLs: urls,
		Wanted: []artifactauth.ArtifactWanted{prefetch}, GrantTTL: time.Minute}, log)
	stop, err := w.svc.Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	// The cache catches up with the records written above.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := w.cache.Node("node-c"); ok && len(w.cache.ActiveRuns()) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache did not catch up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return w
}

func (w *world) ask(t *testing.T, subjectNode string, body any) schemas.Reply[schemas.ArtifactCredential] {
	t.Helper()
	b, err := codec.Encode(codec.MsgPack, body)
	if err != nil {
		t.Fatal(err)
	}
	m, err := w.conn.NC.Request(bus.NodeArtifactCredentials(subjectNode), b, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.ArtifactCredential]
	if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func req(node string, token uint64, digest, run string) schemas.ArtifactCredentialRequest {
	return schemas.ArtifactCredentialRequest{NodeID: node, FencingToken: token, Digest: digest, RunID: run}
}

// TestServiceAnswers: an object source gets a one-time login whose grant
// is stored under the token's hash only; a URL source the headers of its
// longest prefix, or none; a prefetch hook is another reason; everything
// else is refused with its code; nothing logged holds a secret.
func TestServiceAnswers(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()

	rep := w.ask(t, "node-a", req("node-a", 5, digestObj, "run-1"))
	if rep.OK == nil || rep.OK.Login == nil || rep.OK.Login.User != bus.ArtifactUser("node-a") || len(rep.OK.Headers) != 0 {
		t.Fatalf("object source: %+v %+v", rep.OK, rep.Refusal)
	}
	login := rep.OK.Login
	if d := time.Until(login.Expires); d <= 0 || d > time.Minute {
		t.Fatalf("login expires in %s, want within the grant TTL", d)
	}
	var g schemas.ArtifactGrant
	if _, err := bus.GetJSON(ctx, w.grants, schemas.ArtifactGrantKey(login.Token), &g); err != nil {
		t.Fatal(err)
	}
	if g.NodeID != "node-a" || g.FencingToken != 5 || g.Digest != digestObj || g.Object != "sha256/"+strings.Repeat("a", 64) || !g.ExpiresAt.Equal(login.Expires) {
		t.Fatalf("grant %+v", g)
	}
	checkObjectRead(t, w, rep.OK.Object, g, 0)
	// A resumed fetch: the consumer starts at the chunk holding the offset.
	resumed := req("node-a", 5, digestObj, "run-1")
	resumed.Offset = bus.ObjectChunkSize + 5
	if rep := w.ask(t, "node-a", resumed); rep.OK == nil || rep.OK.Object == nil {
		t.Fatalf("resumed: %+v %+v", rep.OK, rep.Refusal)
	} else if rep.OK.Object.Consumer == g.Consumer {
		t.Fatal("a second grant shares the first's consumer")
	} else {
		var g2 schemas.ArtifactGrant
		if _, err := bus.GetJSON(ctx, w.grants, schemas.ArtifactGrantKey(rep.OK.Login.Token), &g2); err != nil {
			t.Fatal(err)
		}
		checkObjectRead(t, w, rep.OK.Object, g2, 1)
	}
	// The token is nowhere in the bucket, keys or values.
	keys, err := w.grants.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := w.grants.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(k, login.Token) || strings.Contains(string(e.Value()), login.Token) {
			t.Fatal("the grant bucket holds the token")
		}
	}
	// Without naming a Run: any Run booked here that mounts it.
	if rep := w.ask(t, "node-a", req("node-a", 5, digestObj, "")); rep.OK == nil || rep.OK.Login == nil || rep.OK.Login.Token == login.Token {
		t.Fatalf("second ask: %+v %+v, want a fresh login", rep.OK, rep.Refusal)
	}
	if rep := w.ask(t, "node-a", req("node-a", 5, digestURL, "run-1")); rep.OK == nil || rep.OK.Login != nil || rep.OK.Headers["Authorization"] != headerSecret {
		t.Fatalf("URL source: %+v %+v", rep.OK, rep.Refusal)
	}
	if rep := w.ask(t, "node-b", req("node-b", 2, digestURL, "")); rep.OK == nil || rep.OK.Login != nil || len(rep.OK.Headers) != 0 {
		t.Fatalf("URL with no configured headers: %+v %+v, want anonymous", rep.OK, rep.Refusal)
	}
	if rep := w.ask(t, "node-b", req("node-b", 2, digestPre, "")); rep.OK == nil || rep.OK.Headers["Authorization"] != headerSecret {
		t.Fatalf("prefetched: %+v %+v", rep.OK, rep.Refusal)
	}

	for _, c := range []struct {
		name    string
		subject string
		body    any
		code    schemas.Code
	}{
		{"stale session", "node-a", req("node-a", 4, digestObj, "run-1"), schemas.CodeStaleFencingToken},
		{"newer token than the registry's", "node-a", req("node-a", 6, digestObj, "run-1"), schemas.CodeStaleFencingToken},
		{"another node's booking", "node-b", req("node-b", 2, digestObj, "run-1"), schemas.CodeArtifactNotWanted},
		{"a finished Run's artifact", "node-a", req("node-a", 5, digestDone, "run-2"), schemas.CodeArtifactNotWanted},
		{"never booked", "node-a", req("node-a", 5, digestNone, ""), schemas.CodeArtifactNotWanted},
		{"another node's prefetch", "node-a", req("node-a", 5, digestPre, ""), schemas.CodeArtifactNotWanted},
		{"an object the store lacks", "node-a", req("node-a", 5, digestGone, "run-6"), schemas.CodeArtifactFetchFailed},
		{"on another node's subject", "node-b", req("node-a", 5, digestObj, "run-1"), schemas.CodeWrongNode},
		{"lapsed lease", "node-c", req("node-c", 3, digestObj, "run-5"), schemas.CodeSessionExpired},
		{"unknown node", "node-z", req("node-z", 1, digestObj, ""), schemas.CodeUnknownNode},
		{"no fencing token", "node-a", req("node-a", 0, digestObj, ""), schemas.CodeMissingField},
		{"not a digest", "node-a", req("node-a", 5, "sha256:abc", ""), schemas.CodeInvalidDigest},
		{"malformed", "node-a", map[string]any{"node_id": 7}, schemas.CodeMalformed},
	} {
		rep := w.ask(t, c.subject, c.body)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code {
			t.Errorf("%s: %+v %+v, want refusal %s", c.name, rep.OK, rep.Refusal, c.code)
		}
	}
	if w.svc.Given() != 6 || w.svc.Refused() != 13 {
		t.Errorf("given %d, refused %d", w.svc.Given(), w.svc.Refused())
	}
	if w.logs.FilterMessage("artifact credential refused").Len() != 13 {
		t.Errorf("refusals logged: %d, want 13", w.logs.FilterMessage("artifact credential refused").Len())
	}
	// A replica whose cache has seen nothing: the Run named is read from
	// wf_runs.
	cold := artifactauth.NewService(w.conn, cache.New(), w.nodes, w.runs, w.grants, artifactauth.Config{}, zap.NewNop())
	if rep := cold.Answer(ctx, bus.NodeArtifactCredentials("node-a"), req("node-a", 5, digestObj, "run-1")); rep.OK == nil || rep.OK.Login == nil {
		t.Errorf("cold replica, Run named: %+v %+v", rep.OK, rep.Refusal)
	}
	if rep := cold.Answer(ctx, bus.NodeArtifactCredentials("node-b"), req("node-b", 2, digestObj, "run-1")); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeArtifactNotWanted {
		t.Errorf("cold replica, another node's Run named: %+v %+v", rep.OK, rep.Refusal)
	}
	for _, e := range w.logs.All() {
		b, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message+string(b), login.Token) || strings.Contains(e.Message+string(b), "s3cr3t") {
			t.Fatalf("a log line holds a secret: %s %s", e.Message, b)
		}
	}
}

// checkObjectRead: the answer names the grant's consumer, an ephemeral pull
// consumer of the object's chunks only, without acks, that the server
// deletes a minute after its last pull, starting at chunk startChunk.
func checkObjectRead(t *testing.T, w *world, r *schemas.ArtifactObjectRead, g schemas.ArtifactGrant, startChunk uint32) {
	t.Helper()
	ctx := context.Background()
	if r == nil || r.Consumer == "" || r.Consumer != g.Consumer || !strings.HasPrefix(r.Consumer, bus.ArtifactConsumer(g.NodeID, "")) {
		t.Fatalf("object read %+v for grant %+v", r, g)
	}
	store, err := w.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.GetInfo(ctx, g.Object)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size != uint64(objectSize) || r.Chunks != 3 || r.Digest != info.Digest || r.StartChunk != startChunk || r.StartByte != int64(startChunk)*bus.ObjectChunkSize {
		t.Fatalf("object read %+v, want %d bytes in 3 chunks from chunk %d, digest %s", r, objectSize, startChunk, info.Digest)
	}
	ci, err := w.conn.JS.Consumer(ctx, bus.ObjectStream(bus.ObjectBucketArtifacts), r.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	c := ci.CachedInfo().Config
	if c.Durable != "" || c.DeliverSubject != "" || c.AckPolicy != jetstream.AckNonePolicy || c.InactiveThreshold != artifactauth.ConsumerInactive ||
		c.FilterSubject != bus.ObjectChunks(bus.ObjectBucketArtifacts, info.NUID) || c.Metadata["node_id"] != g.NodeID {
		t.Fatalf("consumer %+v", c)
	}
	if pending := ci.CachedInfo().NumPending; pending != uint64(3-startChunk) {
		t.Fatalf("consumer has %d chunks pending, want %d", pending, 3-startChunk)
	}
}

// FuzzArtifactCredentialRequest: whatever body arrives on a node's
// credential subject, the service answers it (or refuses it, coded) and
// never crashes; only a valid request can get a credential.
// Seeds are in testdata/fuzz/FuzzArtifactCredentialRequest.
func FuzzArtifactCredentialRequest(f *testing.F) {
	w := newWorld(f)
	good, _ := json.Marshal(req("node-a", 5, digestObj, "run-1"))
	f.Add(good)
	f.Fuzz(func(t *testing.T, body []byte) {
		m := &nats.Msg{Subject: bus.NodeArtifactCredentials("node-a"), Data: body}
		w.svc.Handle(context.Background(), m) // no reply subject: nothing sent
		var r schemas.ArtifactCredentialRequest
		if _, err := codec.DecodeMsg(m, &r); err != nil || r.Validate() != nil {
			before := w.svc.Given()
			w.svc.Handle(context.Background(), m)
			if w.svc.Given() != before {
				t.Fatalf("an invalid request %q got a credential", body)
			}
		}
	})
}
