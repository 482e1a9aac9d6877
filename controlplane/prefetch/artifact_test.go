package prefetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// catalog answers artifact uses from fixed records, newest last, as the
// control plane's catalog does: unknown names and versions, and other
// tenants' records, are refused with CodeArtifactUnknown naming the use's
// field.
type catalog []schemas.ArtifactRecord

func (c catalog) Resolve(_ context.Context, tenant string, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error) {
	var out []schemas.ArtifactMount
	for i, u := range uses {
		field := fmt.Sprintf("artifacts[%d]", i)
		var found *schemas.ArtifactRecord
		for j := range c {
			r := &c[j]
			if r.VisibleTo(tenant) && r.Name == u.Name && (u.Version == "" || u.Version == r.Version) && (u.Digest == "" || u.Digest == r.Digest) {
				found = r
			}
		}
		if found == nil {
			return nil, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: field + ".name",
				Reason: "the catalog holds no " + u.Ref() + ": `warmfleet artifact list` shows what it holds"}
		}
		out = append(out, schemas.ArtifactMount{Name: found.Name, Version: found.Version, Digest: found.Digest, SizeBytes: found.SizeBytes, Source: found.Source, Path: u.Path})
	}
	return out, nil
}

// artifactPlane is a prefetch service served over an embedded NATS, with
// a fleet in its cache.
type artifactPlane struct {
	conn *bus.Conn
	svc  *Service
}

func startArtifactPlane(t *testing.T, r ArtifactResolver, nodes ...schemas.NodeRecord) *artifactPlane {
	t.Helper()
	var opts []Option
	if r != nil {
		opts = append(opts, WithArtifacts(r))
	}
	return startPlane(t, opts, nodes...)
}

// startPlane is startArtifactPlane with the service's options.
func startPlane(t *testing.T, opts []Option, nodes ...schemas.NodeRecord) *artifactPlane {
	t.Helper()
	conn := testenv.ProvisionedBus(t, "prefetch-test")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	kv, err := conn.JS.KeyValue(ctx, bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	for i, n := range nodes {
		c.NoteNode(n, uint64(i+1))
	}
	d := dispatch.New(conn.JS, c, time.Now, zap.NewNop())
	svc := New(kv, conn.NC, c, d, 50*time.Millisecond, time.Now, zap.NewNop(), opts...)
	stop, err := svc.Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		cancel()
		wg.Wait()
	})
	return &artifactPlane{conn: conn, svc: svc}
}

func (pl *artifactPlane) ask(t *testing.T, req schemas.PrefetchRequest) schemas.Reply[schemas.Prefetch] {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := pl.conn.NC.Request(bus.SubjectPrefetch, b, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Prefetch]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		t.Fatalf("reply %q: %v", resp.Data, err)
	}
	return rep
}

// commands reads every command sent to a node on WF_CMDS.
func (pl *artifactPlane) commands(t *testing.T, nodeID string) []schemas.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := pl.conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []schemas.Command
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil || m.Subject != bus.NodeCmd(nodeID) {
			continue
		}
		var c schemas.Command
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

const (
	llamaV1 = "sha256:a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
	llamaV2 = "sha256:b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
)

var llama = catalog{
	{Name: "llama", Version: "v1", Digest: llamaV1, SizeBytes: 100, Source: schemas.ArtifactSource{Object: "llama/v1"}},
	{Name: "llama", Version: "v2", Digest: llamaV2, SizeBytes: 200, Source: schemas.ArtifactSource{URL: "https://models.example/llama-v2"}},
}

// liveNode is a node whose lease runs past the test, with a replica store
// holding held when store is set.
func liveNode(id string, store bool, held ...string) schemas.NodeRecord {
	n := schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 2, Generation: 1, LeaseExpires: time.Now().Add(time.Hour),
		Facts: &schemas.NodeFacts{Support: &schemas.NodeSupport{ContainerRuntime: "containerd", Prewarm: true, ArtifactReplicas: store}}}
	if store {
		n.Facts.Artifacts = &schemas.ArtifactInventory{Enumerated: true}
		for _, d := range held {
			n.Facts.Artifacts.Replicas = append(n.Facts.Artifacts.Replicas, schemas.ArtifactReplica{Digest: d, SizeBytes: 1})
		}
	}
	return n
}

// TestArtifactPrefetchRecordsSendsAndFinishes: an artifact prefetch is
// resolved through the catalog (the newest version when none is named),
// recorded with the resolved artifact, sent as PrepareArtifact to each
// chosen node (a named node without a replica store is skipped with why),
// wanted and kept on disk while open, and finished by the node's
// PrepareArtifact receipt, not by a PrepareImage one. A request sent again
// answers the same record; its id reused for another artifact is refused.
func TestArtifactPrefetchRecordsSendsAndFinishes(t *testing.T) {
	pl := startArtifactPlane(t, llama, liveNode("store-a", true), liveNode("store-b", true, llamaV1), liveNode("plain", false))
	ctx := context.Background()
	req := schemas.PrefetchRequest{RequestID: "warm-llama", Artifact: "llama", Nodes: "store-a,plain"}
	rep := pl.ask(t, req)
	if rep.OK == nil {
		t.Fatalf("refused: %+v", rep.Refusal)
	}
	p := *rep.OK
	if a := p.Artifact; a == nil || a.Name != "llama" || a.Version != "v2" || a.Digest != llamaV2 || a.SizeBytes != 200 || a.Source != llama[1].Source ||
		p.Image != "" || p.ManifestDigest != "" || p.ID != schemas.PrefetchIDFor("warm-llama") {
		t.Fatalf("record %+v / %+v", p, p.Artifact)
	}
	a, plain := p.Node("store-a"), p.Node("plain")
	if a == nil || a.State != schemas.PrefetchSent || a.OperationID != OpID(p.ID, "store-a") ||
		plain == nil || plain.State != schemas.PrefetchSkipped || !strings.Contains(plain.Reason, "no artifact replica store") {
		t.Fatalf("entries %+v", p.Nodes)
	}
	cmds := pl.commands(t, "store-a")
	if len(cmds) != 1 || cmds[0].Kind != schemas.CmdPrepareArtifact || cmds[0].OperationID != a.OperationID || cmds[0].PrepareArtifact.PrefetchID != p.ID ||
		cmds[0].PrepareArtifact.RunID != "" || cmds[0].PrepareArtifact.Digest != llamaV2 || cmds[0].PrepareArtifact.Source != llama[1].Source {
		t.Fatalf("commands to store-a: %+v", cmds)
	}
	if n := len(pl.commands(t, "plain")); n != 0 {
		t.Fatalf("the node without a store got %d commands", n)
	}
	// Sent again: the same record, still one command (WF_CMDS dedupes).
	if again := pl.ask(t, req); again.OK == nil || again.OK.ID != p.ID || !again.OK.CreatedAt.Equal(p.CreatedAt) {
		t.Fatalf("resend: %+v", again)
	}
	if n := len(pl.commands(t, "store-a")); n != 1 {
		t.Fatalf("%d commands after a resend, want 1", n)
	}
	if c := pl.ask(t, schemas.PrefetchRequest{RequestID: "warm-llama", Artifact: "llama:v1"}); c.Refusal == nil || c.Refusal.Code != schemas.CodeRequestIDConflict {
		t.Fatalf("a request id reused for another version: %+v", c)
	}
	if c := pl.ask(t, schemas.PrefetchRequest{RequestID: "warm-llama", Image: "registry.example/m@" + llamaV2}); c.Refusal == nil || c.Refusal.Code != schemas.CodeRequestIDConflict {
		t.Fatalf("a request id reused for an image of the same digest: %+v", c)
	}

	s := pl.svc
	if !s.WantsArtifact("store-a", llamaV2) || s.WantsArtifact("store-a", llamaV1) || s.WantsArtifact("plain", llamaV2) || s.WantsArtifact("store-a", "") ||
		s.Wants("store-a", schemas.ImageRef{}) {
		t.Fatal("WantsArtifact does not follow the open entries")
	}
	if keep := s.DiskKeep("store-a"); len(keep) != 1 || keep[0].Kind != schemas.DiskItemArtifact || keep[0].ID != llamaV2 || keep[0].Reason == "" {
		t.Fatalf("keep on store-a: %+v", keep)
	}
	// A PrepareImage receipt under the artifact's operation changes nothing.
	rc := schemas.OperationReceipt{OperationID: a.OperationID, PrefetchID: p.ID, Kind: schemas.CmdPrepareImage, Outcome: schemas.OutcomeApplied}
	if err := s.Receipt(ctx, "store-a", rc); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.Get(p.ID); q.Node("store-a").State != schemas.PrefetchSent {
		t.Fatalf("a PrepareImage receipt finished an artifact entry: %+v", q.Node("store-a"))
	}
	rc.Kind = schemas.CmdPrepareArtifact
	if err := s.Receipt(ctx, "store-a", rc); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.Get(p.ID); q.Node("store-a").State != schemas.PrefetchReady {
		t.Fatalf("the PrepareArtifact receipt did not make the entry ready: %+v", q.Node("store-a"))
	}
	if s.WantsArtifact("store-a", llamaV2) || len(s.DiskKeep("store-a")) != 0 {
		t.Fatal("a ready entry still wants the artifact")
	}

	// A failure without a code of its own fails the entry as a fetch failure.
	rep = pl.ask(t, schemas.PrefetchRequest{RequestID: "warm-v1", Artifact: "llama@" + llamaV1, Nodes: "store-a"})
	if rep.OK == nil || rep.OK.Artifact.Version != "v1" {
		t.Fatalf("prefetch by digest: %+v %+v", rep.OK, rep.Refusal)
	}
	f := schemas.OperationReceipt{OperationID: rep.OK.Node("store-a").OperationID, PrefetchID: rep.OK.ID, Kind: schemas.CmdPrepareArtifact,
		Outcome: schemas.OutcomeFailed, Message: "digest mismatch"}
	if err := s.Receipt(ctx, "store-a", f); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.Get(rep.OK.ID); q.Node("store-a").State != schemas.PrefetchFailed || q.Node("store-a").Code != schemas.CodeArtifactFetchFailed ||
		!strings.Contains(q.Node("store-a").Reason, "digest mismatch") {
		t.Fatalf("failed entry %+v", q.Node("store-a"))
	}
}

// TestArtifactPrefetchRefusals: an artifact the catalog does not hold is
// refused with the catalog's code on the request's field; with a count,
// nodes that hold the replica are not targets, and when only they match
// the request is refused saying so; a node without a store is no target.
func TestArtifactPrefetchRefusals(t *testing.T) {
	pl := startArtifactPlane(t, llama, liveNode("store-b", true, llamaV2), liveNode("plain", false))
	for _, c := range []struct {
		name  string
		req   schemas.PrefetchRequest
		code  schemas.Code
		field string
		why   string
	}{
		{"unknown name", schemas.PrefetchRequest{RequestID: "r1", Artifact: "mistral"}, schemas.CodeArtifactUnknown, "artifact", "catalog"},
		{"unknown version", schemas.PrefetchRequest{RequestID: "r2", Artifact: "llama:v9"}, schemas.CodeArtifactUnknown, "artifact", "catalog"},
		{"malformed", schemas.PrefetchRequest{RequestID: "r3", Artifact: "Llama"}, schemas.CodeInvalidArtifact, "artifact", ""},
		{"both", schemas.PrefetchRequest{RequestID: "r4", Artifact: "llama", Image: "registry.example/m@" + llamaV1}, schemas.CodeMalformed, "artifact", "not both"},
		{"only hot nodes", schemas.PrefetchRequest{RequestID: "r5", Artifact: "llama", Count: 1}, schemas.CodeNoPrefetchTarget, "nodes", "replica"},
		{"only nodes without a store", schemas.PrefetchRequest{RequestID: "r6", Artifact: "llama", Nodes: "plain"}, schemas.CodeNoPrefetchTarget, "nodes", "replica store"},
	} {
		rep := pl.ask(t, c.req)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != c.field || !strings.Contains(rep.Refusal.Reason, c.why) {
			t.Errorf("%s: %+v %+v, want %s on %q saying %q", c.name, rep.OK, rep.Refusal, c.code, c.field, c.why)
		}
	}
	// Without a count, a node that holds it is sent the prefetch: it answers at once.
	if rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "r7", Artifact: "llama"}); rep.OK == nil || len(rep.OK.Nodes) != 1 || rep.OK.Nodes[0].NodeID != "store-b" {
		t.Fatalf("every node: %+v %+v", rep.OK, rep.Refusal)
	}
}

// TestArtifactPrefetchWithoutCatalog: a service given no resolver refuses
// artifact prefetches, saying why, and still serves images.
func TestArtifactPrefetchWithoutCatalog(t *testing.T) {
	pl := startArtifactPlane(t, nil, liveNode("store-a", true))
	rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "r1", Artifact: "llama"})
	if rep.Refusal == nil || rep.Refusal.Field != "artifact" || !strings.Contains(rep.Refusal.Reason, "no artifact catalog") {
		t.Fatalf("artifact without a catalog: %+v %+v", rep.OK, rep.Refusal)
	}
	if rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "r2", Image: "registry.example/m@" + llamaV1}); rep.OK == nil {
		t.Fatalf("image without a catalog: %+v", rep.Refusal)
	}
	if _, err := pl.svc.content(context.Background(), schemas.PrefetchRequest{Artifact: "llama"}); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: "artifact"}) {
		t.Fatalf("content: %v", err)
	}
}
