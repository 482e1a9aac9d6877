package intake_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/runs"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// waiting is a scheduler that never decides at intake: these tests look at
// what intake stores, not at placement.
type waiting struct{}

func (waiting) AtIntake(schemas.Run) lifecycle.Transition { return nil }
func (waiting) Poke()                                     {}

type plane struct {
	conn     *bus.Conn
	runsKV   jetstream.KeyValue
	consumer jetstream.Consumer
	cat      *artifacts.Catalog
	store    *runs.Store
	cache    *cache.Cache
}

func newPlane(t *testing.T) (plane, *testenv.NATS) {
	t.Helper()
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "cp")
	ctx := context.Background()
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	store := runs.NewStore(kv, conn.JS, c, runs.Config{MaxAttempts: 3, Poke: func() {}, Now: time.Now}, zap.NewNop())
	cat, err := artifacts.Open(ctx, conn.JS, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := conn.JS.CreateOrUpdateConsumer(ctx, bus.RunsStream(schemas.DefaultTenant), jetstream.ConsumerConfig{Durable: "test-intake", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return plane{conn: conn, runsKV: kv, consumer: cons, cat: cat, store: store, cache: c}, n
}

// submit publishes req on the default tenant's submit subject and hands the delivery to in.
func (p plane) submit(t *testing.T, in *intake.Intake, req schemas.RunRequest) {
	t.Helper()
	p.submitAs(t, in, req, req.RequestID)
}

// submitAs is submit under message id msgID.
func (p plane) submitAs(t *testing.T, in *intake.Intake, req schemas.RunRequest, msgID string) {
	t.Helper()
	b, _ := json.Marshal(req)
	m := nats.NewMsg(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser))
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	if _, err := p.conn.JS.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	p.deliver(t, in)
}

// deliver fetches the next WF_RUNS message and lets intake handle it.
func (p plane) deliver(t *testing.T, in *intake.Intake) {
	t.Helper()
	msgs, err := p.consumer.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range msgs.Messages() {
		got++
		meta, _ := m.Metadata()
		in.Handle(context.Background(), intake.Parse(m, meta != nil && meta.NumDelivered > 1))
	}
	if got != 1 {
		t.Fatalf("fetched %d intake messages: %v", got, msgs.Error())
	}
}

// lastEvent reads the last event published for a Run.
func (p plane) lastEvent(t *testing.T, runID string) (schemas.RunEvent, bool) {
	t.Helper()
	s, err := p.conn.JS.Stream(context.Background(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), bus.RunEventsSubject(schemas.DefaultTenant, runID))
	if err != nil {
		return schemas.RunEvent{}, false
	}
	var ev schemas.RunEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev, true
}

func request(id string, uses ...schemas.ArtifactUse) schemas.RunRequest {
	return schemas.RunRequest{RequestID: id, Image: "registry.example/app@sha256:" + fmt.Sprintf("%064x", 1), Artifacts: uses}
}

// TestArtifactsResolvedAtIntake: a Run naming an artifact the catalog does
// not hold is rejected artifact_unknown, naming the use's field; a known
// one is stored with its mount resolved, in the request's order; a catalog
// that cannot answer leaves the submit for redelivery, unrejected.
func TestArtifactsResolvedAtIntake(t *testing.T) {
	p, n := newPlane(t)
	ctx := context.Background()
	in := intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), p.cat, nil, nil, time.Now, zap.NewNop())

	content := []byte("model weights")
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	obs, err := p.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "sha256/"+hex.EncodeToString(sum[:]), content); err != nil {
		t.Fatal(err)
	}
	rec := schemas.ArtifactRecord{Name: "llama", Version: "v1", Digest: digest, SizeBytes: int64(len(content)),
		Source: schemas.ArtifactSource{Object: "sha256/" + hex.EncodeToString(sum[:])}}
	if _, err := p.cat.Register(ctx, rec); err != nil {
		t.Fatal(err)
	}

	// Unknown: rejected, naming the field, and no Run stored.
	p.submit(t, in, request("unknown-1", schemas.ArtifactUse{Name: "llama", Path: "/m"}, schemas.ArtifactUse{Name: "mistral", Path: "/n"}))
	id := schemas.RunIDFor(schemas.DefaultTenant, "unknown-1")
	ev, ok := p.lastEvent(t, id)
	if !ok || ev.Type != schemas.EventRejected || ev.Code != schemas.CodeArtifactUnknown || ev.Field != "artifacts[1].name" || ev.Message == "" {
		t.Fatalf("want a rejection artifact_unknown on artifacts[1].name, got %+v (%v)", ev, ok)
	}
	if _, err := p.runsKV.Get(ctx, id); err == nil {
		t.Fatal("a rejected Run was stored")
	}

	// Known: stored resolved, in order.
	p.submit(t, in, request("known-1", schemas.ArtifactUse{Name: "llama", Digest: digest, Path: "/models/a"}, schemas.ArtifactUse{Name: "llama", Path: "/models/b"}))
	var run schemas.Run
	if _, err := bus.GetJSON(ctx, p.runsKV, schemas.RunIDFor(schemas.DefaultTenant, "known-1"), &run); err != nil {
		t.Fatalf("known artifact: Run not stored: %v", err)
	}
	if len(run.Artifacts) != 2 || run.Artifacts[0].Path != "/models/a" || run.Artifacts[1].Path != "/models/b" ||
		run.Artifacts[0].Version != "v1" || run.Artifacts[0].Digest != digest || run.Artifacts[0].Source != rec.Source || run.Artifacts[0].SizeBytes != rec.SizeBytes {
		t.Fatalf("stored artifacts %+v", run.Artifacts)
	}

	// The same submit again after its artifact left the catalog (sent
	// under another message id, past WF_RUNS' dedupe): the Run stands.
	if _, err := p.cat.Remove(ctx, "llama", "v1"); err != nil {
		t.Fatal(err)
	}
	p.submitAs(t, in, request("known-1", schemas.ArtifactUse{Name: "llama", Digest: digest, Path: "/models/a"}, schemas.ArtifactUse{Name: "llama", Path: "/models/b"}), "known-1-again")
	if ev, _ := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, "known-1")); ev.Type == schemas.EventRejected {
		t.Fatalf("a duplicate submit of an accepted Run was rejected: %+v", ev)
	}
	if _, err := obs.PutBytes(ctx, rec.Source.Object, content); err != nil { // Remove took the object too
		t.Fatal(err)
	}
	if _, err := p.cat.Register(ctx, rec); err != nil {
		t.Fatal(err)
	}

	// The catalog unavailable (its connection closed): no rejection, the
	// submit stays for redelivery and is accepted once the catalog answers.
	down := testenv.Dial(t, n.URL(), "cp-down")
	gone, err := artifacts.Open(ctx, down.JS, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	down.Close()
	flaky := intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), gone, nil, nil, time.Now, zap.NewNop())
	p.submit(t, flaky, request("later-1", schemas.ArtifactUse{Name: "llama", Path: "/m"}))
	if ev, ok := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, "later-1")); ok {
		t.Fatalf("a transient catalog failure published %+v", ev)
	}
	p.deliver(t, in) // the redelivery
	if _, err := bus.GetJSON(ctx, p.runsKV, schemas.RunIDFor(schemas.DefaultTenant, "later-1"), &run); err != nil || len(run.Artifacts) != 1 {
		t.Fatalf("redelivered submit: %+v, %v", run.Artifacts, err)
	}
}

// TestArtifactsOfAnotherTenant: a Run may mount its tenant's artifacts and
// shared ones only: another tenant's private record is rejected
// artifact_unknown on the use's field, in the words a missing one gets,
// and no Run is stored; another tenant's shared record is resolved.
func TestArtifactsOfAnotherTenant(t *testing.T) {
	p, _ := newPlane(t)
	ctx := context.Background()
	in := intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), p.cat, nil, nil, time.Now, zap.NewNop())
	obs, err := p.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name   string
		shared bool
	}{{"private-weights", false}, {"tokenizer", true}} {
		content := []byte(r.name + " bytes")
		sum := sha256.Sum256(content)
		object := "sha256/" + hex.EncodeToString(sum[:])
		if _, err := obs.PutBytes(ctx, object, content); err != nil {
			t.Fatal(err)
		}
		rec := schemas.ArtifactRecord{Name: r.name, Version: "v1", Digest: "sha256:" + hex.EncodeToString(sum[:]), SizeBytes: int64(len(content)),
			Source: schemas.ArtifactSource{Object: object}, Tenant: "team-a", Shared: r.shared}
		if _, err := p.cat.Register(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}

	// The Runs here are the default tenant's.
	p.submit(t, in, request("foreign-1", schemas.ArtifactUse{Name: "tokenizer", Path: "/t"}, schemas.ArtifactUse{Name: "private-weights", Path: "/m"}))
	foreign, ok := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, "foreign-1"))
	if !ok || foreign.Type != schemas.EventRejected || foreign.Code != schemas.CodeArtifactUnknown || foreign.Field != "artifacts[1].name" {
		t.Fatalf("want a rejection artifact_unknown on artifacts[1].name, got %+v (%v)", foreign, ok)
	}
	if _, err := p.runsKV.Get(ctx, schemas.RunIDFor(schemas.DefaultTenant, "foreign-1")); err == nil {
		t.Fatal("a Run naming another tenant's artifact was stored")
	}
	p.submit(t, in, request("missing-1", schemas.ArtifactUse{Name: "tokenizer", Path: "/t"}, schemas.ArtifactUse{Name: "absent-weights", Path: "/m"}))
	missing, _ := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, "missing-1"))
	if strings.ReplaceAll(missing.Message, "absent-weights", "private-weights") != foreign.Message || missing.Field != foreign.Field || missing.Code != foreign.Code {
		t.Fatalf("another tenant's artifact is refused otherwise than a missing one:\n%+v\n%+v", foreign, missing)
	}

	p.submit(t, in, request("shared-1", schemas.ArtifactUse{Name: "tokenizer", Path: "/t"}))
	var run schemas.Run
	if _, err := bus.GetJSON(ctx, p.runsKV, schemas.RunIDFor(schemas.DefaultTenant, "shared-1"), &run); err != nil || len(run.Artifacts) != 1 || run.Artifacts[0].Name != "tokenizer" {
		t.Fatalf("another tenant's shared artifact: %+v, %v", run.Artifacts, err)
	}
}
