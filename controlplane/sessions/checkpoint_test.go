package sessions_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestCheckpointsOnlyForTheLeaseHolder: the lease holder takes and
// restores a checkpoint through the control plane, chunks as large as a
// request allows included; another node, and the holder once its epoch
// is past, are refused every read and write; the successor restores what
// its predecessor committed.
func TestCheckpointsOnlyForTheLeaseHolder(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	ctx := testCtx(t)
	a, b := remote(nc, "host-a"), remote(nc, "host-b")
	key := residency.Key{Tenant: tenant, Session: "ckpt-1"}
	f.place(t, key, "host-a")
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	big := make([]byte, residency.ChunkSize+5)
	_, _ = rand.Read(big)
	for name, b := range map[string][]byte{"big": big, "small": []byte("hello")} {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	holder := &residency.RemoteCheckpoints{Remote: a, Key: key, Epoch: g.Epoch}
	id := checkpoint.ID{Sequence: 1, Epoch: uint64(g.Epoch)}
	m, st, err := checkpoint.Take(ctx, src, holder, id, checkpoint.Options{ChunkSize: residency.ChunkSize})
	if err != nil {
		t.Fatal(err)
	}
	if st.ChunksMoved != 3 {
		t.Errorf("moved %d chunks, want 3", st.ChunksMoved)
	}
	digest := m.Entries[0].Chunks[0]
	other := &residency.RemoteCheckpoints{Remote: b, Key: key, Epoch: g.Epoch}
	refused := func(who string, s checkpoint.Store) {
		t.Helper()
		if _, err := s.HasChunk(ctx, digest); !errors.Is(err, residency.ErrNotLeaseHolder) {
			t.Errorf("%s: has: %v, want ErrNotLeaseHolder", who, err)
		}
		if _, err := s.GetChunk(ctx, digest); !errors.Is(err, residency.ErrNotLeaseHolder) {
			t.Errorf("%s: get: %v, want ErrNotLeaseHolder", who, err)
		}
		if err := s.PutChunk(ctx, digest, checkpoint.Chunk{Data: []byte("forged")}); !errors.Is(err, residency.ErrNotLeaseHolder) {
			t.Errorf("%s: put: %v, want ErrNotLeaseHolder", who, err)
		}
		if err := s.PutManifest(ctx, checkpoint.ID{Sequence: 2, Epoch: uint64(g.Epoch)}, []byte("{}")); !errors.Is(err, residency.ErrNotLeaseHolder) {
			t.Errorf("%s: put record: %v, want ErrNotLeaseHolder", who, err)
		}
		if _, err := s.GetManifest(ctx, id); !errors.Is(err, residency.ErrNotLeaseHolder) {
			t.Errorf("%s: get record: %v, want ErrNotLeaseHolder", who, err)
		}
	}
	refused("another node", other)
	if _, err := holder.HasChunk(ctx, "../../x"); !errors.Is(err, residency.ErrInvalidRequest) {
		t.Errorf("a malformed digest: %v, want ErrInvalidRequest", err)
	}
	if _, err := holder.GetManifest(ctx, checkpoint.ID{Sequence: 7, Epoch: uint64(g.Epoch)}); !errors.Is(err, checkpoint.ErrIncomplete) {
		t.Errorf("a checkpoint never taken: %v, want checkpoint.ErrIncomplete", err)
	}
	if err := holder.PutManifest(ctx, checkpoint.ID{Sequence: 2, Epoch: uint64(g.Epoch) + 1}, []byte("{}")); !errors.Is(err, residency.ErrInvalidRequest) {
		t.Errorf("a record of another epoch than the holder's: %v, want ErrInvalidRequest", err)
	}

	// The lease moves to host-b: host-a's epoch is stale.
	if err := a.ReleaseSessionLease(ctx, g); err != nil {
		t.Fatal(err)
	}
	f.place(t, key, "host-b")
	g2, err := b.AcquireSessionLease(ctx, key, "host-b")
	if err != nil {
		t.Fatal(err)
	}
	refused("the old holder", holder)
	successor := &residency.RemoteCheckpoints{Remote: b, Key: key, Epoch: g2.Epoch}
	dst := filepath.Join(t.TempDir(), "ws")
	if _, _, err := checkpoint.Restore(ctx, successor, id, dst, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "big")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("restored big file: %d bytes, %v", len(got), err)
	}
}

// TestOldCheckpointsForgotten: once a session commits more workspace
// checkpoints than the control plane keeps (3), the oldest one's record
// and the chunks only it named are deleted; the kept ones restore, and the
// session's record lists them.
func TestOldCheckpointsForgotten(t *testing.T) {
	f := newFixture(t)
	nc := f.agentConn(t)
	ctx := testCtx(t)
	a := remote(nc, "host-a")
	key := residency.Key{Tenant: tenant, Session: "ckpt-kept"}
	f.place(t, key, "host-a")
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	store := &residency.RemoteCheckpoints{Remote: a, Key: key, Epoch: g.Epoch}
	src := t.TempDir()
	var prev *checkpoint.Manifest
	for seq := uint64(1); seq <= 4; seq++ {
		b := make([]byte, 100<<10)
		_, _ = rand.Read(b)
		if err := os.WriteFile(filepath.Join(src, "state"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		m, st, err := checkpoint.Take(ctx, src, store, checkpoint.ID{Sequence: seq, Epoch: uint64(g.Epoch)}, checkpoint.Options{ChunkSize: residency.ChunkSize, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		prev = &m
		cp := residency.Checkpoint{Key: residency.WireKey(key), Host: "host-a", Epoch: g.Epoch, Sequence: seq, CompatibilityID: compatA,
			Namespace: residency.NamespaceFor(key), Content: &schemas.CheckpointSummary{Files: st.Files, Bytes: st.Bytes, BytesMoved: st.BytesMoved}}
		if err := a.CommitCheckpoint(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	first := checkpoint.ID{Sequence: 1, Epoch: uint64(g.Epoch)}
	deadline := time.Now().Add(10 * time.Second)
	for _, err := store.GetManifest(ctx, first); !errors.Is(err, checkpoint.ErrIncomplete); _, err = store.GetManifest(ctx, first) {
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint 1 still held after the fourth commit: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for seq := uint64(2); seq <= 4; seq++ {
		if _, _, err := checkpoint.Restore(ctx, store, checkpoint.ID{Sequence: seq, Epoch: uint64(g.Epoch)}, filepath.Join(t.TempDir(), "ws"), 0); err != nil {
			t.Errorf("kept checkpoint %d: %v", seq, err)
		}
	}
	var rec schemas.SessionRecord
	if _, err := bus.GetJSON(ctx, kv(t, f, bus.BucketSessions), key.String(), &rec); err != nil || len(rec.Recent) != 3 || rec.Recent[0].Sequence != 2 {
		t.Errorf("session record lists %+v (%v), want checkpoints 2 to 4", rec.Recent, err)
	}
	// The state a holder loads offers the kept ones before the latest,
	// newest first.
	st, err := a.LoadSessionState(ctx, key)
	if err != nil || st.CheckpointSequence != 4 || len(st.EarlierCheckpoints) != 2 ||
		st.EarlierCheckpoints[0].Sequence != 3 || st.EarlierCheckpoints[1].Sequence != 2 {
		t.Errorf("loaded state: latest %d, earlier %+v (%v); want 4, then 3 and 2", st.CheckpointSequence, st.EarlierCheckpoints, err)
	}
}
