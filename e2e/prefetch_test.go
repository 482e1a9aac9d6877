package e2e

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_Prefetch: two cold nodes can both import an image (each
// world's image dir holds it). An operator prefetches it onto node-b: the
// prefetch record shows node-b's import as it moves, then ready, and node-b's
// facts list the image hot. The next Run of that image goes to node-b, and
// its decision shows why: the image hot there with nothing to pull, node-a
// eligible but outscored with the image's bytes to pull.
func TestAcceptance_Prefetch(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	// Random bytes do not compress: the import takes long enough to report.
	rng := rand.New(rand.NewPCG(3, 4))
	blob := make([]byte, 32<<20)
	for i := range blob {
		blob[i] = byte(rng.Uint32())
	}
	big := testenv.BuildBusyboxImage(t, wa.imageDir, "big", testenv.WithFile("/data/blob", string(blob)))
	if again := testenv.BuildBusyboxImage(t, wb.imageDir, "big", testenv.WithFile("/data/blob", string(blob))); again.ManifestDigest != big.ManifestDigest {
		t.Fatalf("the two worlds' images differ: %s, %s", big.ManifestDigest, again.ManifestDigest)
	}
	f := newFleet(t, func(c *controlplane.Config) { c.PrefetchFlushInterval = 20 * time.Millisecond })
	f.startAgent(agentSpec{id: "node-a", world: wa})
	f.startAgent(agentSpec{id: "node-b", world: wb, progressInterval: 5 * time.Millisecond})

	req := schemas.PrefetchRequest{RequestID: "warm-b", Image: big.Reference, Nodes: "node-b"}
	id := schemas.PrefetchIDFor(req.RequestID)
	// Watch the record from before it exists, to see every state it passes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := f.conn.JS.KeyValue(ctx, bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var mu sync.Mutex
	var seen []schemas.PrefetchNode
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var p schemas.Prefetch
			if json.Unmarshal(e.Value(), &p) != nil || p.Node("node-b") == nil {
				continue
			}
			mu.Lock()
			seen = append(seen, *p.Node("node-b"))
			done := p.Node("node-b").State.Finished()
			mu.Unlock()
			if done {
				return
			}
		}
	}()

	body, _ := json.Marshal(req)
	resp, err := f.conn.NC.Request(bus.SubjectPrefetch, body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Prefetch]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("prefetch: %v %+v", err, rep.Refusal)
	}
	if len(rep.OK.Nodes) != 1 || rep.OK.Nodes[0].NodeID != "node-b" {
		t.Fatalf("prefetch went to %+v, want node-b only", rep.OK.Nodes)
	}
	select {
	case <-watched:
	case <-time.After(90 * time.Second):
		t.Fatal("node-b's prefetch entry did not finish in 90s")
	}
	mu.Lock()
	last := seen[len(seen)-1]
	var pulling []schemas.TransferProgress
	for _, n := range seen {
		if n.State == schemas.PrefetchPulling {
			pulling = append(pulling, *n.Progress)
		}
	}
	mu.Unlock()
	if last.State != schemas.PrefetchReady {
		t.Fatalf("node-b's entry ended %s: %s %s", last.State, last.Code, last.Reason)
	}
	if len(pulling) == 0 {
		t.Fatalf("no progress recorded for a %d-byte import: %+v", big.SizeBytes, seen)
	}
	for i, p := range pulling {
		if p.TotalBytes != big.SizeBytes || (i > 0 && p.DoneBytes < pulling[i-1].DoneBytes) {
			t.Fatalf("progress %+v: want growing counts of %d bytes", pulling, big.SizeBytes)
		}
	}
	bigRef, err := schemas.ParseImageRef("image", big.Reference)
	if err != nil {
		t.Fatal(err)
	}
	// The control plane's copy follows its own write a moment after the watch above.
	f.eventually(30*time.Second, "a finished prefetch to want the image no more", func() bool {
		return !f.plane.Prefetches().Wants("node-b", bigRef)
	})
	f.waitImageHot("node-b", big.ManifestDigest, 30*time.Second)

	run := f.submit(schemas.RunRequest{RequestID: "after-prefetch", Image: big.Reference, Command: []string{"true"}})
	done := f.waitPhase(run, schemas.PhaseSucceeded, 90*time.Second)
	d := f.decision(run)
	warm, cold := candidate(d, "node-b"), candidate(d, "node-a")
	if done.NodeID != "node-b" || d.Winner != "node-b" || warm.Components.ImageState != string(schemas.LocalityHot) || warm.Components.PullBytes != 0 {
		t.Fatalf("ran on %s; winner %s, node-b candidate %+v", done.NodeID, d.Winner, warm)
	}
	if !cold.Eligible || cold.Reason != schemas.ReasonOutscored || cold.Components.PullBytes == 0 || cold.Cost <= warm.Cost {
		t.Fatalf("node-a should be eligible, outscored, with bytes to pull: %+v", cold)
	}
}

// TestAcceptance_PrefetchFromPrivateRegistry: a prefetch is a reason for a
// node to hold a registry credential, as a booking is. An image in a
// registry behind htpasswd, with no Run booked anywhere, is prefetched onto
// node-a: the agent asks the control plane for the credential at pull time,
// gets it for that prefetch, pulls, and its facts list the image hot. Once
// the entry is finished the same node is refused a credential for it.
func TestAcceptance_PrefetchFromPrivateRegistry(t *testing.T) {
	w := newWorld(t)
	reg := testenv.StartRegistry(t)
	ref := pushPrivate(t, reg, "prefetched")
	f := newFleet(t, func(c *controlplane.Config) {
		c.RegistryAuth = registryAuthFile(t, map[string][2]string{reg.Host: {reg.User, reg.Password}}, nil)
	})
	f.startAgent(agentSpec{id: "node-a", world: w})

	body, _ := json.Marshal(schemas.PrefetchRequest{RequestID: "warm-private", Image: ref, Nodes: "node-a"})
	resp, err := f.conn.NC.Request(bus.SubjectPrefetch, body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Prefetch]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("prefetch: %v %+v", err, rep.Refusal)
	}
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	var entry schemas.PrefetchNode
	f.eventually(90*time.Second, "node-a's prefetch entry to finish", func() bool {
		e, err := kv.Get(context.Background(), rep.OK.ID)
		if err != nil {
			return false
		}
		var p schemas.Prefetch
		if json.Unmarshal(e.Value(), &p) != nil || p.Node("node-a") == nil {
			return false
		}
		entry = *p.Node("node-a")
		return entry.State.Finished()
	})
	if entry.State != schemas.PrefetchReady {
		t.Fatalf("node-a's entry ended %s: %s %s", entry.State, entry.Code, entry.Reason)
	}
	pinned, err := schemas.ParseImageRef("image", ref)
	if err != nil {
		t.Fatal(err)
	}
	f.waitImageHot("node-a", pinned.Digest, 30*time.Second)

	// Finished: the prefetch no longer stands for node-a, and nothing is
	// booked there, so the control plane refuses the credential.
	f.eventually(30*time.Second, "the finished prefetch to want the image no more", func() bool {
		return !f.plane.Prefetches().Wants("node-a", pinned)
	})
	rec := f.nodeRecord("node-a")
	ask, _ := json.Marshal(schemas.RegistryCredentialRequest{NodeID: "node-a", FencingToken: rec.FencingToken, Reference: ref})
	m, err := f.conn.NC.Request(bus.NodeRegistryCredentials("node-a"), ask, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var cred schemas.Reply[schemas.RegistryCredential]
	if err := json.Unmarshal(m.Data, &cred); err != nil || cred.OK != nil || cred.Refusal == nil || cred.Refusal.Code != schemas.CodeImageNotWanted {
		t.Fatalf("credential after the prefetch ended: %s (%v), want refused %s", m.Data, err, schemas.CodeImageNotWanted)
	}
}
