package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_SessionStateSurvivesMove: a session's workspace (a
// 200 MiB file, a symlink, a nested file and an empty directory) is
// checkpointed through the control plane by its release and is there,
// byte for byte, when the session is attached on another node. The
// session's record names the checkpoint; the next release there moves
// only what changed.
func TestAcceptance_SessionStateSurvivesMove(t *testing.T) {
	f := bulkSessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "state-1"}
	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id}); r.Host != a.id {
		t.Fatalf("attach: %+v", r)
	}
	wsA := filepath.Join(a.ws, key.Tenant, key.Session)
	big := filepath.Join(wsA, "model", "weights.bin")
	if err := os.MkdirAll(filepath.Dir(big), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := writeRandomFile(t, big, 200<<20)
	if err := os.Symlink("model/weights.bin", filepath.Join(wsA, "current")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(wsA, "cache", "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wsA, "cache", "state.json"), []byte(`{"step":41}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("release: %v", rep.Error)
	}
	rec, ok := f.sessionRecord(key)
	if !ok || rec.Checkpoint == nil || rec.Checkpoint.Files != 2 || rec.Checkpoint.Bytes != 200<<20+11 {
		t.Fatalf("session record after release: %+v (checkpoint %+v), want a checkpoint of 2 files", rec, rec.Checkpoint)
	}

	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: b.id}); r.Host != b.id || r.Epoch != 2 {
		t.Fatalf("attach on node-b: %+v", r)
	}
	wsB := filepath.Join(b.ws, key.Tenant, key.Session)
	if got := fileSum(t, filepath.Join(wsB, "current")); got != sum {
		t.Fatalf("200 MiB file through the symlink on node-b: sha256 %x, want %x", got, sum)
	}
	if target, err := os.Readlink(filepath.Join(wsB, "current")); err != nil || target != "model/weights.bin" {
		t.Errorf("symlink on node-b: %q, %v", target, err)
	}
	if got, err := os.ReadFile(filepath.Join(wsB, "cache", "state.json")); err != nil || !bytes.Equal(got, []byte(`{"step":41}`)) {
		t.Errorf("state.json on node-b: %q, %v", got, err)
	}
	if info, err := os.Stat(filepath.Join(wsB, "cache", "empty")); err != nil || !info.IsDir() {
		t.Errorf("empty directory on node-b: %v", err)
	}
	if err := os.WriteFile(filepath.Join(wsB, "cache", "state.json"), []byte(`{"step":42}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("second release: %v", rep.Error)
	}
	if rec, _ := f.sessionRecord(key); rec.CheckpointSequence != 2 || rec.Checkpoint == nil || rec.Checkpoint.BytesMoved > 1<<20 {
		t.Errorf("second checkpoint: %+v (%+v), want sequence 2 moving well under 1 MiB", rec, rec.Checkpoint)
	}
}

// TestAcceptance_NodeLossRestoresCheckpoint: node-a checkpoints its
// resident session periodically and is then stopped without releasing
// anything; once its lease lapses the session comes back on node-b from
// the last periodic checkpoint, and its record names it.
func TestAcceptance_NodeLossRestoresCheckpoint(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l, checkpointInterval: 300 * time.Millisecond})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "lossy-1"}
	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id}); r.Host != a.id {
		t.Fatalf("attach: %+v", r)
	}
	if err := os.WriteFile(filepath.Join(a.ws, key.Tenant, key.Session, "progress.json"), []byte(`{"epoch":41}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var periodic residency.SessionRecord
	f.eventually(20*time.Second, "a periodic checkpoint holding progress.json", func() bool {
		rec, ok := f.sessionRecord(key)
		periodic = rec
		return ok && rec.Checkpoint != nil && rec.Checkpoint.Files == 1 && rec.Epoch == 1
	})
	a.part.stop(t)
	rb := f.attachWhenLeaseFree(key, 30*time.Second, "node-b to attach after node-a's lease lapsed")
	if rb.Host != b.id || rb.Epoch != 2 {
		t.Fatalf("attach after the loss: %+v, want node-b at epoch 2", rb)
	}
	if got, err := os.ReadFile(filepath.Join(b.ws, key.Tenant, key.Session, "progress.json")); err != nil || string(got) != `{"epoch":41}` {
		t.Fatalf("progress.json on node-b: %q, %v; want what periodic checkpoint %d held", got, err, periodic.CheckpointSequence)
	}
	rec, _ := f.sessionRecord(key)
	if rec.Epoch != 1 || rec.CheckpointSequence < periodic.CheckpointSequence || rec.Checkpoint == nil {
		t.Fatalf("session record after the loss: %+v, want node-a's last periodic checkpoint", rec)
	}
	// The session's events say which checkpoint node-b restored, and when
	// node-a took it.
	var attached *schemas.SessionEvent
	committed := map[uint64]bool{}
	for _, ev := range f.sessionEvents(key) {
		switch {
		case ev.Type == schemas.SessionCheckpointed && ev.Node == a.id:
			committed[ev.Sequence] = true
		case ev.Type == schemas.SessionAttached && ev.Epoch == 2:
			attached = &ev
		}
	}
	if !committed[rec.CheckpointSequence] {
		t.Errorf("no session.checkpointed event for node-a's checkpoint %d (events for %v)", rec.CheckpointSequence, committed)
	}
	if attached == nil || attached.Node != b.id || attached.Restored == nil || attached.Restored.Sequence != rec.CheckpointSequence ||
		attached.Restored.Epoch != 1 || !attached.Restored.TakenAt.Equal(rec.Checkpoint.TakenAt) {
		t.Errorf("session.attached event at epoch 2: %+v, want node-b restoring checkpoint %d taken %s", attached, rec.CheckpointSequence, rec.Checkpoint.TakenAt)
	}
}

// writeRandomFile writes size random bytes to p and returns their SHA-256.
func writeRandomFile(t *testing.T, p string, size int64) [32]byte {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// TestAcceptance_StaleHolderCannotCheckpoint: node-a holds a session and
// is stopped; node-b takes it over under epoch 2. Whatever node-a's
// identity then sends, at its old epoch, is refused before it is stored:
// chunks, a checkpoint record of the next sequence, and its commit. The
// checkpoint node-c restores after node-b's release is node-b's.
func TestAcceptance_StaleHolderCannotCheckpoint(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "stale-1"}
	f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
	a.part.stop(t)
	rb := f.attachWhenLeaseFree(key, 30*time.Second, "node-b to attach after node-a stopped")
	if rb.Host != b.id || rb.Epoch != 2 {
		t.Fatalf("takeover: %+v", rb)
	}
	if err := os.WriteFile(filepath.Join(b.ws, key.Tenant, key.Session, "owner"), []byte("node-b"), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	late := &residency.RemoteCheckpoints{Remote: &residency.Remote{NC: f.conn.NC, NodeID: a.id, Timeout: 5 * time.Second}, Key: key, Epoch: 1}
	forged := []byte("node-a was here")
	sum := sha256.Sum256(forged)
	digest := hex.EncodeToString(sum[:])
	if err := late.PutChunk(ctx, digest, checkpoint.Chunk{Data: forged}); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Errorf("stale chunk: %v, want not_lease_holder", err)
	}
	if err := late.PutManifest(ctx, checkpoint.ID{Sequence: 1, Epoch: 1}, []byte(`{"manifest_pieces":["`+digest+`"],"manifest_bytes":15}`)); !errors.Is(err, residency.ErrNotLeaseHolder) {
		t.Errorf("stale record: %v, want not_lease_holder", err)
	}
	if err := late.Remote.CommitCheckpoint(ctx, residency.Checkpoint{Key: residency.WireKey(key), Host: a.id, Epoch: 1, Sequence: 1,
		CompatibilityID: sessCompat, Namespace: residency.NamespaceFor(key), Content: &schemas.CheckpointSummary{Files: 1}}); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("stale commit: %v, want epoch_superseded", err)
	}

	if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("release on node-b: %v", rep.Error)
	}
	c := f.startSessionNode(sessionNodeSpec{id: "node-c", ledger: l})
	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: c.id}); r.Host != c.id || r.Epoch != 3 {
		t.Fatalf("attach on node-c: %+v", r)
	}
	if got, err := os.ReadFile(filepath.Join(c.ws, key.Tenant, key.Session, "owner")); err != nil || string(got) != "node-b" {
		t.Errorf("node-c restored %q, %v; want node-b's checkpoint", got, err)
	}
	if rec, _ := f.sessionRecord(key); rec.Epoch != 2 || rec.Host != b.id {
		t.Errorf("session record %+v, want node-b's commit at epoch 2", rec)
	}
}
