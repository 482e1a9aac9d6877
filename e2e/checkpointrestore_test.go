package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_IncrementalCheckpoint: a resident session's 128 MiB
// workspace is checkpointed whole when the session asks; after one small
// change (64 KiB rewritten inside one of its 32 files) the next checkpoint
// it asks for moves less than 1 % of it.
func TestAcceptance_IncrementalCheckpoint(t *testing.T) {
	f := bulkSessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "big-1"}
	f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
	ws := filepath.Join(a.ws, key.Tenant, key.Session)
	const files, size = 32, 4 << 20
	for i := range files {
		writeRandomFile(t, filepath.Join(ws, fmt.Sprintf("shard-%02d.bin", i)), size)
	}
	// ask checkpoints the workspace as the session does, and returns the
	// session's record once the checkpoint is committed.
	ask := func(seq uint64) schemas.CheckpointSummary {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(ws, ".warmfleet"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, residency.CheckpointRequestFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var rec residency.SessionRecord
		f.eventually(4*time.Minute, fmt.Sprintf("checkpoint %d, asked for", seq), func() bool {
			var ok bool
			rec, ok = f.sessionRecord(key)
			return ok && rec.CheckpointSequence == seq && rec.Checkpoint != nil
		})
		return *rec.Checkpoint
	}
	if c := ask(1); c.Bytes != files*size || c.BytesMoved < files*size {
		t.Fatalf("first checkpoint: %+v, want all %d bytes moved", c, files*size)
	}
	fh, err := os.OpenFile(filepath.Join(ws, "shard-17.bin"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(make([]byte, 64<<10), 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	// The workspace now also holds the answer to the first ask.
	c := ask(2)
	if c.Bytes < files*size || c.BytesMoved*100 >= c.Bytes {
		t.Errorf("after a 64 KiB change the checkpoint moved %d of %d bytes (%.2f %%), want under 1 %%", c.BytesMoved, c.Bytes, 100*float64(c.BytesMoved)/float64(c.Bytes))
	}
	t.Logf("incremental checkpoint moved %d of %d bytes (%.3f %%)", c.BytesMoved, c.Bytes, 100*float64(c.BytesMoved)/float64(c.Bytes))
}

// TestAcceptance_DamagedCheckpointOffersPrevious: the latest checkpoint's
// chunks are damaged in wf_checkpoints; an attach refuses it with
// checkpoint_corrupt, starts nothing, and offers the checkpoint before it,
// which an attach with from_checkpoint then restores.
func TestAcceptance_DamagedCheckpointOffersPrevious(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "damaged-1"}
	ctx := context.Background()
	bucket, err := checkpoint.OpenObjectBucket(ctx, f.conn.JS, bus.ObjectBucketCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	store, err := bucket.Session(key.Tenant, key.Session)
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for i, body := range []string{"version one", "version two"} {
		f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
		if err := os.WriteFile(filepath.Join(a.ws, key.Tenant, key.Session, "model.txt"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
			t.Fatalf("release %d: %v", i+1, rep.Error)
		}
		if i == 0 {
			if before, err = store.Chunks(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	after, err := store.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range after {
		if !slices.Contains(before, c) {
			if err := store.PutChunk(ctx, c, checkpoint.Chunk{Data: []byte("bit rot")}); err != nil {
				t.Fatal(err)
			}
		}
	}

	rep := f.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: b.id})
	if e := rep.Error; e == nil || e.Code != schemas.SessionCode(checkpoint.CodeCorrupt) || e.PreviousCheckpoint != 1 {
		t.Fatalf("attach over a damaged checkpoint: %+v, want checkpoint_corrupt offering checkpoint 1", e)
	}
	if len(b.host.Residencies()) != 0 {
		t.Fatal("a session started on node-b from a damaged checkpoint")
	}
	r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: b.id, FromCheckpoint: 1})
	if r.Host != b.id {
		t.Fatalf("attach from checkpoint 1: %+v", r)
	}
	if got, err := os.ReadFile(filepath.Join(b.ws, key.Tenant, key.Session, "model.txt")); err != nil || string(got) != "version one" {
		t.Fatalf("restored from checkpoint 1: %q, %v", got, err)
	}
}
