package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/schemas"
)

// artifactBytes is n deterministic pseudo-random bytes: incompressible,
// like weights, and the same in every run.
func artifactBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	var key [32]byte
	key[0] = seed
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

func sha256Of(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// putArtifact stores data in the artifact bucket, as `nats object put`
// would, and registers it as name:version.
func (f *fleet) putArtifact(name, version string, data []byte) schemas.ArtifactRecord {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	obs, err := f.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		f.t.Fatal(err)
	}
	digest := sha256Of(data)
	object := "sha256/" + strings.TrimPrefix(digest, "sha256:")
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: object}, bytes.NewReader(data)); err != nil {
		f.t.Fatalf("put %s: %v", object, err)
	}
	return f.registerArtifact(schemas.ArtifactRecord{Name: name, Version: version, Digest: digest, SizeBytes: int64(len(data)),
		Source: schemas.ArtifactSource{Object: object}})
}

// registerArtifact asks the control plane to add rec to the catalog.
func (f *fleet) registerArtifact(rec schemas.ArtifactRecord) schemas.ArtifactRecord {
	f.t.Helper()
	body, _ := json.Marshal(schemas.ArtifactRegistration{Record: rec})
	resp, err := f.conn.NC.Request(bus.SubjectArtifactRegister, body, 10*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	var rep schemas.Reply[schemas.ArtifactRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		f.t.Fatalf("register %s:%s: %v %+v", rec.Name, rec.Version, err, rep.Refusal)
	}
	return *rep.OK
}

// drain stops new work going to node.
func (f *fleet) drain(node string) {
	f.t.Helper()
	body, _ := json.Marshal(schemas.AdminRequest{ID: node})
	resp, err := f.conn.NC.Request(bus.SubjectDrain, body, 5*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	var rep schemas.Reply[schemas.NodeRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		f.t.Fatalf("drain %s: %v %+v", node, err, rep.Refusal)
	}
}

// waitReplica waits until node's facts list a verified replica of digest.
func (f *fleet) waitReplica(node, digest string, within time.Duration) {
	f.t.Helper()
	f.eventually(within, node+"'s facts to list artifact "+digest, func() bool {
		held, _ := f.nodeRecord(node).Facts.ArtifactsOf()
		_, ok := held[digest]
		return ok
	})
}

// stdout is what a Run's first attempt printed, as stored.
func (f *fleet) stdout(runID string) string {
	f.t.Helper()
	return string(f.stored(runID).bytes[[2]string{schemas.WorkloadID(runID, 1), bus.LogStdout}])
}

// replicaPath is where a node with data dir dataDir keeps digest's replica.
func replicaPath(dataDir, digest string) string {
	return filepath.Join(dataDir, "artifacts", "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// readsArtifact is a Run that prints the sha256 of the artifact mounted at
// /data/weights and proves the mount read-only.
func readsArtifact(requestID, image, name string) schemas.RunRequest {
	return schemas.RunRequest{RequestID: requestID, Image: image,
		Command:   []string{"sh", "-c", "sha256sum /data/weights && if echo x >> /data/weights; then echo WRITABLE; else echo read-only; fi"},
		Artifacts: []schemas.ArtifactUse{{Name: name, Path: "/data/weights"}}}
}

// TestAcceptance_ArtifactLocality: two nodes; one holds a 200 MiB artifact.
// The Run goes to it, and the decision says why in bytes. Forced onto the
// other node, the Run fetches, verifies and mounts the artifact; the
// container reads the expected bytes, read-only.
func TestAcceptance_ArtifactLocality(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t)
	data := artifactBytes(200<<20, 1)
	rec := f.putArtifact("weights", "v1", data)
	hexSum := strings.TrimPrefix(rec.Digest, "sha256:")

	f.startAgent(agentSpec{id: "node-held", world: wa})
	first := f.submit(readsArtifact("fill", wa.image.Reference, "weights"))
	if r := f.waitPhase(first, schemas.PhaseSucceeded, 2*time.Minute); r.NodeID != "node-held" {
		t.Fatalf("first Run ran on %s", r.NodeID)
	}
	f.waitReplica("node-held", rec.Digest, 30*time.Second)
	f.startAgent(agentSpec{id: "node-cold", world: wb})

	id := f.submit(readsArtifact("goes-to-replica", wa.image.Reference, "weights"))
	done := f.waitPhase(id, schemas.PhaseSucceeded, time.Minute)
	if done.NodeID != "node-held" {
		t.Fatalf("ran on %s, want node-held", done.NodeID)
	}
	d := f.decision(id)
	held, cold := candidate(d, "node-held"), candidate(d, "node-cold")
	if held.Components.ArtifactFetchBytes != 0 || held.Components.ArtifactsWarm != 1 {
		t.Fatalf("node-held should fetch nothing: %+v", held.Components)
	}
	if !cold.Eligible || cold.Reason != schemas.ReasonOutscored || cold.Components.ArtifactFetchBytes != rec.SizeBytes {
		t.Fatalf("node-cold should be outscored by the %d bytes it would fetch: %+v", rec.SizeBytes, cold)
	}

	f.drain("node-held")
	forced := f.submit(readsArtifact("forced-cold", wa.image.Reference, "weights"))
	r := f.waitPhase(forced, schemas.PhaseSucceeded, 2*time.Minute)
	if r.NodeID != "node-cold" {
		t.Fatalf("forced Run ran on %s", r.NodeID)
	}
	if c := candidate(f.decision(forced), "node-cold"); c.Components.ArtifactFetchBytes != rec.SizeBytes {
		t.Fatalf("node-cold's decision entry: %+v", c.Components)
	}
	var out string
	f.eventually(30*time.Second, "the forced Run's output", func() bool { out = f.stdout(forced); return strings.Contains(out, "only") })
	if !strings.Contains(out, hexSum) || !strings.Contains(out, "read-only") || strings.Contains(out, "WRITABLE") {
		t.Fatalf("container read %q; want sha256 %s and a read-only mount", out, hexSum)
	}
	f.waitReplica("node-cold", rec.Digest, 30*time.Second)
}

// TestAcceptance_ArtifactCorruption: a flipped byte in a replica is caught
// before launch and the replica is fetched again; a source serving wrong
// bytes fails the Run with artifact_digest_mismatch, once, and keeps
// nothing of them.
func TestAcceptance_ArtifactCorruption(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	data := artifactBytes(8<<20, 2)
	rec := f.putArtifact("weights", "v1", data)
	hexSum := strings.TrimPrefix(rec.Digest, "sha256:")
	dir := tempDir(t)
	f.startAgent(agentSpec{id: "node", world: w, dataDir: dir})

	first := f.submit(readsArtifact("fill", w.image.Reference, "weights"))
	f.waitPhase(first, schemas.PhaseSucceeded, time.Minute)
	path := replicaPath(dir, rec.Digest)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := fh.ReadAt(b, 4096); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := fh.WriteAt(b, 4096); err != nil {
		t.Fatal(err)
	}
	_ = fh.Close()

	again := f.submit(readsArtifact("after-flip", w.image.Reference, "weights"))
	f.waitPhase(again, schemas.PhaseSucceeded, time.Minute)
	var out string
	f.eventually(30*time.Second, "the Run's output", func() bool { out = f.stdout(again); return strings.Contains(out, "only") })
	if !strings.Contains(out, hexSum) {
		t.Fatalf("container read %q; want the artifact's sha256 %s", out, hexSum)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("replica not fetched again (err %v)", err)
	}

	// A source that serves other bytes than its digest names.
	var served atomic.Int64
	wrong := artifactBytes(1<<20, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = w.Write(wrong)
	}))
	t.Cleanup(srv.Close)
	liar := artifactBytes(1<<20, 4)
	f.registerArtifact(schemas.ArtifactRecord{Name: "liar", Version: "v1", Digest: sha256Of(liar), SizeBytes: int64(len(liar)),
		Source: schemas.ArtifactSource{URL: srv.URL + "/liar.bin"}})
	bad := f.submit(readsArtifact("wrong-bytes", w.image.Reference, "liar"))
	r := f.waitPhase(bad, schemas.PhaseFailed, time.Minute)
	if r.Reason != string(schemas.CodeArtifactDigestMismatch) {
		t.Fatalf("reason %q, want %s", r.Reason, schemas.CodeArtifactDigestMismatch)
	}
	if _, err := os.Stat(replicaPath(dir, sha256Of(liar))); !os.IsNotExist(err) {
		t.Fatalf("wrong bytes kept as a replica: %v", err)
	}
	partials, _ := filepath.Glob(filepath.Join(dir, "artifacts", "partial", "*", "*"))
	if len(partials) != 0 {
		t.Fatalf("wrong bytes kept as a partial fetch: %v", partials)
	}
	// The Run fails on its prepare's receipt; its launch command may be
	// handled after that.
	f.waitHandled(bus.StreamCmds, bus.NodeCmd("node"), 30*time.Second)
	if n := served.Load(); n != 1 {
		t.Fatalf("the lying source was read %d times; a launch after a failed prepare must not fetch again", n)
	}
}

// TestAcceptance_ArtifactFromURL: an artifact whose source is an HTTP
// server on loopback that demands a bearer token. The control plane holds
// the token (serve --artifact-source-auth) and hands it over per fetch; the
// node fetches, verifies and mounts the bytes, and a partial fetch cut by
// the server resumes with a Range request instead of starting over.
func TestAcceptance_ArtifactFromURL(t *testing.T) {
	w := newWorld(t)
	data := artifactBytes(16<<20, 5)
	const token = "Bearer url-secret-7f3a"
	var (
		requests, sent atomic.Int64
		ranged         atomic.Bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := requests.Add(1)
		if r.Header.Get("Authorization") != token {
			http.Error(rw, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Header.Get("Range") != "" {
			ranged.Store(true)
		}
		http.ServeContent(&countingWriter{ResponseWriter: rw, n: &sent, cutAfter: cutFirst(n, len(data)/2)}, r, "weights.bin", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(srv.Close)
	auth, err := artifactauth.ParseURLSource(srv.URL + "/models/ Authorization: " + token + "\n")
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, func(c *controlplane.Config) { c.ArtifactSourceAuth = auth })
	rec := f.registerArtifact(schemas.ArtifactRecord{Name: "weights", Version: "v1", Digest: sha256Of(data), SizeBytes: int64(len(data)),
		Source: schemas.ArtifactSource{URL: srv.URL + "/models/weights.bin"}})
	f.startAgent(agentSpec{id: "node", world: w})

	id := f.submit(readsArtifact("from-url", w.image.Reference, "weights"))
	f.waitPhase(id, schemas.PhaseSucceeded, time.Minute)
	var out string
	f.eventually(30*time.Second, "the Run's output", func() bool { out = f.stdout(id); return strings.Contains(out, "only") })
	if !strings.Contains(out, strings.TrimPrefix(rec.Digest, "sha256:")) || !strings.Contains(out, "read-only") {
		t.Fatalf("container read %q; want sha256 %s, read-only", out, rec.Digest)
	}
	if !ranged.Load() {
		t.Fatal("the fetch cut half way started over instead of resuming with a Range request")
	}
	if got := sent.Load(); got > int64(len(data))+int64(len(data))/4 {
		t.Fatalf("the server sent %d bytes for a %d-byte artifact: the resume fetched again what it had", got, len(data))
	}
	f.waitReplica("node", rec.Digest, 30*time.Second)
	// The token travelled by request/reply only: not in the catalog.
	if b, _ := json.Marshal(rec); strings.Contains(string(b), "url-secret") {
		t.Fatal("the source's credential is in the catalog record")
	}
}

// cutFirst is how many bytes the first response may send before the
// connection is cut; later responses are whole (-1).
func cutFirst(request int64, half int) int64 {
	if request == 1 {
		return int64(half)
	}
	return -1
}

// countingWriter counts the body bytes a response sends and, past cutAfter
// (≥ 0), stops sending and aborts the connection.
type countingWriter struct {
	http.ResponseWriter
	n        *atomic.Int64
	cutAfter int64
	written  int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.cutAfter >= 0 && c.written+int64(len(p)) > c.cutAfter {
		p = p[:c.cutAfter-c.written]
		n, _ := c.ResponseWriter.Write(p)
		c.n.Add(int64(n))
		if fl, ok := c.ResponseWriter.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler)
	}
	n, err := c.ResponseWriter.Write(p)
	c.written += int64(n)
	c.n.Add(int64(n))
	return n, err
}

// TestAcceptance_PrefetchArtifact: `warmfleet prefetch --artifact` warms a
// node with no Run booked: the prefetch is a reason for the node to be given
// the fetch's credential, the entry ends ready, the node's facts list the
// replica, and the next Run naming the artifact goes there, fetching nothing.
func TestAcceptance_PrefetchArtifact(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t, func(c *controlplane.Config) { c.PrefetchFlushInterval = 20 * time.Millisecond })
	data := artifactBytes(24<<20, 6)
	rec := f.putArtifact("weights", "v1", data)
	f.startAgent(agentSpec{id: "node-a", world: wa})
	f.startAgent(agentSpec{id: "node-b", world: wb})

	body, _ := json.Marshal(schemas.PrefetchRequest{RequestID: "warm-b", Artifact: "weights:v1", Nodes: "node-b"})
	resp, err := f.conn.NC.Request(bus.SubjectPrefetch, body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Prefetch]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("prefetch: %v %+v", err, rep.Refusal)
	}
	if len(rep.OK.Nodes) != 1 || rep.OK.Nodes[0].NodeID != "node-b" || rep.OK.Artifact == nil || rep.OK.Artifact.Digest != rec.Digest {
		t.Fatalf("prefetch record %+v", rep.OK)
	}
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	f.eventually(time.Minute, "node-b's prefetch entry to finish", func() bool {
		e, err := kv.Get(context.Background(), rep.OK.ID)
		if err != nil {
			return false
		}
		var p schemas.Prefetch
		if json.Unmarshal(e.Value(), &p) != nil || p.Node("node-b") == nil || !p.Node("node-b").State.Finished() {
			return false
		}
		if n := p.Node("node-b"); n.State != schemas.PrefetchReady {
			t.Fatalf("node-b's entry ended %s: %s %s", n.State, n.Code, n.Reason)
		}
		return true
	})
	f.waitReplica("node-b", rec.Digest, 30*time.Second)
	f.eventually(30*time.Second, "a finished prefetch to want the artifact no more", func() bool {
		return !f.plane.Prefetches().WantsArtifact("node-b", rec.Digest)
	})

	id := f.submit(readsArtifact("after-prefetch", wa.image.Reference, "weights"))
	if r := f.waitPhase(id, schemas.PhaseSucceeded, time.Minute); r.NodeID != "node-b" {
		d, _ := json.MarshalIndent(f.decision(id), "", " ")
		t.Fatalf("ran on %s, want the prefetched node-b; decision %s", r.NodeID, d)
	}
	if c := candidate(f.decision(id), "node-b"); c.Components.ArtifactFetchBytes != 0 {
		t.Fatalf("node-b would fetch %d artifact bytes after the prefetch", c.Components.ArtifactFetchBytes)
	}
}
