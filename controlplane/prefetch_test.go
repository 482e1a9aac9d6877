package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/prefetch"
	"github.com/warmfleet/warmfleet/schemas"
)

// askPrefetch sends a prefetch request and returns the reply.
func (pl *testPlane) askPrefetch(t *testing.T, req schemas.PrefetchRequest) schemas.Reply[schemas.Prefetch] {
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

// prefetchRecord reads a prefetch's stored record.
func (pl *testPlane) prefetchRecord(t *testing.T, id string) *schemas.Prefetch {
	t.Helper()
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	var p schemas.Prefetch
	if _, err := bus.GetJSON(context.Background(), kv, id, &p); err != nil {
		t.Fatalf("prefetch %s: %v", id, err)
	}
	return &p
}

// prepareCommands reads every PrepareImage sent to a node on WF_CMDS.
func (pl *testPlane) prepareCommands(t *testing.T, nodeID string) []schemas.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := pl.conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(bus.NodeCmd(nodeID)))
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
		if c.Kind == schemas.CmdPrepareImage {
			out = append(out, c)
		}
	}
	return out
}

// observe publishes a node's observation on its obs subject.
func (pl *testPlane) observe(t *testing.T, nodeID string, token uint64, o schemas.Observation, msgID string) {
	t.Helper()
	o.NodeID, o.FencingToken, o.Generation = nodeID, token, 1
	pl.publish(t, bus.NodeObs(nodeID), msgID, o)
}

// TestPrefetchRecordsProgressAndReceipts: a prefetch request is recorded in
// wf_prefetch with an entry per chosen node (a named draining node
// skipped, with why), each live node gets one PrepareImage however often
// the request is sent, and what the node reports through WF_OBS moves its
// entry: progress to pulling with the counts, an applied receipt to ready,
// a failed one to failed with the node's code. Wants follows the entry.
func TestPrefetchRecordsProgressAndReceipts(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: 10 * time.Second, ReconcileInterval: 50 * time.Millisecond, OpenEnrollment: true})
	enrA := pl.enroll(t, "node-a")
	pl.enroll(t, "node-b")
	body, _ := json.Marshal(schemas.AdminRequest{ID: "node-b"})
	if _, err := pl.conn.NC.Request(bus.SubjectDrain, body, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "node-b draining", func() bool { n, _ := pl.node(t, "node-b"); return n.State == schemas.NodeDraining })
	digest := "sha256:" + fmt.Sprintf("%064x", 7)
	image := "registry.example/team/model@" + digest

	req := schemas.PrefetchRequest{RequestID: "warm-1", Image: image, Nodes: "node-a,node-b"}
	var p schemas.Prefetch
	eventually(t, 20*time.Second, "the prefetch accepted (the replica sees node-b draining)", func() bool {
		rep := pl.askPrefetch(t, req)
		if rep.Refusal != nil {
			t.Fatalf("refused: %v", rep.Refusal)
		}
		p = *rep.OK
		return p.Node("node-b") != nil && p.Node("node-b").State == schemas.PrefetchSkipped
	})
	if p.ID != schemas.PrefetchIDFor("warm-1") || p.ManifestDigest != digest || len(p.Nodes) != 2 || p.Selector != "node=node-a,node=node-b" {
		t.Fatalf("record %+v", p)
	}
	a := p.Node("node-a")
	if a.State != schemas.PrefetchSent || a.OperationID != prefetch.OpID(p.ID, "node-a") || !strings.Contains(p.Node("node-b").Reason, "draining") {
		t.Fatalf("entries %+v", p.Nodes)
	}
	// Sent again: the same record, and still one command.
	if rep := pl.askPrefetch(t, req); rep.OK == nil || rep.OK.ID != p.ID || rep.OK.CreatedAt != p.CreatedAt {
		t.Fatalf("resend: %+v", rep)
	}
	cmds := pl.prepareCommands(t, "node-a")
	if len(cmds) != 1 {
		t.Fatalf("%d PrepareImage commands for node-a, want 1", len(cmds))
	}
	c := cmds[0]
	if c.OperationID != a.OperationID || c.FencingToken != enrA.FencingToken || c.PrepareImage.PrefetchID != p.ID ||
		c.PrepareImage.RunID != "" || c.PrepareImage.ManifestDigest != digest || !c.PrepareImage.Unpack {
		t.Fatalf("command %+v / %+v", c, *c.PrepareImage)
	}
	if n := len(pl.prepareCommands(t, "node-b")); n != 0 {
		t.Fatalf("the draining node got %d commands", n)
	}
	ref, err := schemas.ParseImageRef("image", image)
	if err != nil {
		t.Fatal(err)
	}
	otherDigest := ref
	otherDigest.Digest = "sha256:" + fmt.Sprintf("%064x", 8)
	wants := func(node string, r schemas.ImageRef) bool { return pl.cp.Prefetches().Wants(node, r) }
	if !wants("node-a", ref) || wants("node-b", ref) || wants("node-a", otherDigest) {
		t.Fatal("Wants does not follow the unfinished entries")
	}

	// Progress, as the agent reports it; a report under a stale token is dropped.
	progress := func(token uint64, done int64, id string) {
		pl.observe(t, "node-a", token, schemas.Observation{Kind: schemas.ObsImageProgress, ImageProgress: &schemas.ImageProgress{
			OperationID: a.OperationID, PrefetchID: p.ID, ManifestDigest: digest, Progress: schemas.TransferProgress{DoneBytes: done, TotalBytes: 100}}}, id)
	}
	progress(enrA.FencingToken-1, 90, "")
	progress(enrA.FencingToken, 40, "")
	eventually(t, 10*time.Second, "node-a pulling", func() bool {
		n := pl.prefetchRecord(t, p.ID).Node("node-a")
		return n.State == schemas.PrefetchPulling && n.Progress != nil && n.Progress.DoneBytes == 40 && n.Progress.TotalBytes == 100
	})
	receipt := func(id string, rc schemas.OperationReceipt) {
		rc.Kind, rc.AcceptedAt = schemas.CmdPrepareImage, time.Now()
		pl.observe(t, "node-a", enrA.FencingToken, schemas.Observation{Kind: schemas.ObsReceipt, Receipt: &rc}, id)
	}
	receipt("rc-1", schemas.OperationReceipt{OperationID: a.OperationID, PrefetchID: p.ID, Outcome: schemas.OutcomeApplied})
	eventually(t, 10*time.Second, "node-a ready", func() bool {
		n := pl.prefetchRecord(t, p.ID).Node("node-a")
		return n.State == schemas.PrefetchReady && n.Progress.DoneBytes == 100
	})
	eventually(t, 20*time.Second, "Wants false once ready", func() bool { return !wants("node-a", ref) })
	// Progress after the receipt changes nothing, once handled.
	progress(enrA.FencingToken, 50, "")
	pl.waitHandled(t, bus.StreamObs, bus.NodeObs("node-a"))
	if n := pl.prefetchRecord(t, p.ID).Node("node-a"); n.State != schemas.PrefetchReady {
		t.Fatalf("a late progress report moved a ready entry: %+v", n)
	}

	// A failed pull fails the entry with the node's code and message.
	rep := pl.askPrefetch(t, schemas.PrefetchRequest{RequestID: "warm-2", Image: image, Nodes: "node-a"})
	if rep.OK == nil {
		t.Fatalf("second prefetch: %+v", rep.Refusal)
	}
	q := rep.OK
	receipt("rc-2", schemas.OperationReceipt{OperationID: q.Node("node-a").OperationID, PrefetchID: q.ID, Outcome: schemas.OutcomeFailed,
		Code: schemas.CodeLaunchFailed, Message: "pull: not found"})
	eventually(t, 10*time.Second, "node-a failed", func() bool {
		n := pl.prefetchRecord(t, q.ID).Node("node-a")
		return n.State == schemas.PrefetchFailed && n.Code == schemas.CodeLaunchFailed && strings.Contains(n.Reason, "pull: not found")
	})

	// A command refused for a superseded session is sent again under the
	// node's current one, and the entry stays open.
	rep = pl.askPrefetch(t, schemas.PrefetchRequest{RequestID: "warm-3", Image: image, Nodes: "node-a"})
	if rep.OK == nil {
		t.Fatalf("third prefetch: %+v", rep.Refusal)
	}
	r := rep.OK
	op := r.Node("node-a").OperationID
	again := pl.enroll(t, "node-a")
	if again.FencingToken <= enrA.FencingToken {
		t.Fatalf("re-enrollment kept fencing token %d", again.FencingToken)
	}
	enrA = again
	eventually(t, 20*time.Second, "the control plane to see node-a's new session", func() bool {
		n, _ := pl.node(t, "node-a")
		return n.FencingToken == again.FencingToken
	})
	receipt("rc-3", schemas.OperationReceipt{OperationID: op, PrefetchID: r.ID, Outcome: schemas.OutcomeRefused, Code: schemas.CodeStaleFencingToken})
	eventually(t, 10*time.Second, "the prefetch sent again under the new session", func() bool {
		for _, c := range pl.prepareCommands(t, "node-a") {
			if c.OperationID == op && c.FencingToken == again.FencingToken {
				return true
			}
		}
		return false
	})
	if n := pl.prefetchRecord(t, r.ID).Node("node-a"); n.State != schemas.PrefetchSent || !wants("node-a", ref) {
		t.Fatalf("a refusal for a superseded session closed the entry: %+v", n)
	}
}

// TestPrefetchRefusals: bad input is refused with its code and the field
// it names, and records nothing.
func TestPrefetchRefusals(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: 10 * time.Second, OpenEnrollment: true})
	pl.enroll(t, "node-a")
	good := "registry.example/m@sha256:" + fmt.Sprintf("%064x", 1)
	for _, c := range []struct {
		name  string
		req   schemas.PrefetchRequest
		code  schemas.Code
		field string
	}{
		{"tag only", schemas.PrefetchRequest{RequestID: "x1", Image: "registry.example/m:latest"}, schemas.CodeImageNotPinned, "image"},
		{"no request id", schemas.PrefetchRequest{Image: good}, schemas.CodeMissingField, "request_id"},
		{"bad selector", schemas.PrefetchRequest{RequestID: "x2", Image: good, Nodes: "colour=red"}, schemas.CodeInvalidSelector, "nodes"},
		{"unknown node", schemas.PrefetchRequest{RequestID: "x3", Image: good, Nodes: "node-zz"}, schemas.CodeUnknownNode, "nodes"},
		{"nothing matches", schemas.PrefetchRequest{RequestID: "x4", Image: good, Nodes: "arch=riscv64"}, schemas.CodeNoPrefetchTarget, "nodes"},
		{"negative count", schemas.PrefetchRequest{RequestID: "x5", Image: good, Count: -1}, schemas.CodeTooManyItems, "count"},
	} {
		rep := pl.askPrefetch(t, c.req)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != c.field {
			t.Errorf("%s: %+v %+v, want %s on %q", c.name, rep.OK, rep.Refusal, c.code, c.field)
		}
	}
	if rep := pl.askPrefetch(t, schemas.PrefetchRequest{RequestID: "same", Image: good}); rep.OK == nil {
		t.Fatalf("prefetch on every node: %+v", rep.Refusal)
	}
	other := "registry.example/m@sha256:" + fmt.Sprintf("%064x", 2)
	if rep := pl.askPrefetch(t, schemas.PrefetchRequest{RequestID: "same", Image: other}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeRequestIDConflict {
		t.Fatalf("a request id reused for another image: %+v", rep)
	}
	resp, err := pl.conn.NC.Request(bus.SubjectPrefetch, []byte(`{"image":`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Prefetch]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.Refusal == nil {
		t.Fatalf("malformed body answered %s", resp.Data)
	}
}

// TestArtifactPrefetchReceiptThroughIngest: a node's PrepareArtifact
// receipt for an artifact prefetch, published on WF_OBS, reaches the
// prefetch service through ingest and finishes the node's entry; until
// then WantsArtifact holds for the node and digest.
func TestArtifactPrefetchReceiptThroughIngest(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{HeartbeatInterval: 10 * time.Second, OpenEnrollment: true})
	enr := pl.enroll(t, "node-a")
	digest := "sha256:" + fmt.Sprintf("%064x", 9)
	id := schemas.PrefetchIDFor("warm-artifact")
	now := time.Now()
	op := prefetch.OpID(id, "node-a")
	// Recorded as the service records a resolved artifact prefetch (the
	// catalog is wired beside this test's plane).
	kv, err := pl.conn.JS.KeyValue(context.Background(), bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	rec := schemas.Prefetch{ID: id, RequestID: "warm-artifact", CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		Artifact: &schemas.PrefetchArtifact{Name: "llama", Version: "v1", Digest: digest, SizeBytes: 10, Source: schemas.ArtifactSource{Object: "llama/v1"}},
		Nodes:    []schemas.PrefetchNode{{NodeID: "node-a", State: schemas.PrefetchSent, OperationID: op, UpdatedAt: now}}}
	if _, err := bus.CreateJSON(context.Background(), kv, id, rec); err != nil {
		t.Fatal(err)
	}
	wants := func() bool { return pl.cp.Prefetches().WantsArtifact("node-a", digest) }
	eventually(t, 20*time.Second, "the service to mirror the record", wants)
	rc := schemas.OperationReceipt{OperationID: op, PrefetchID: id, Kind: schemas.CmdPrepareArtifact, Outcome: schemas.OutcomeApplied, AcceptedAt: time.Now()}
	pl.observe(t, "node-a", enr.FencingToken, schemas.Observation{Kind: schemas.ObsReceipt, Receipt: &rc}, "rc-artifact")
	eventually(t, 10*time.Second, "node-a ready", func() bool { return pl.prefetchRecord(t, id).Node("node-a").State == schemas.PrefetchReady })
	eventually(t, 20*time.Second, "WantsArtifact false once ready", func() bool { return !wants() })
}
