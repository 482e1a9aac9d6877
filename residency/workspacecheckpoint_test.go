package residency

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
)

// checkpointHosts are two hosts over one control plane whose releases
// checkpoint workspaces into wf_checkpoints, on the in-memory runtime.
func checkpointHosts(t *testing.T, target RuntimeTarget) (a, b *host, durable *memDurable, bucket *checkpoint.ObjectBucket) {
	t.Helper()
	return checkpointHostsWith(t, target, hostConfig{})
}

// checkpointHostsWith is checkpointHosts with both hosts' checkpoint
// interval and hooks as in base, and a lease of 2 s when base sets an
// interval (the tests of loss wait one out).
func checkpointHostsWith(t *testing.T, target RuntimeTarget, base hostConfig) (a, b *host, durable *memDurable, bucket *checkpoint.ObjectBucket) {
	t.Helper()
	env := newBus(t)
	ttl := 10 * time.Second
	if base.checkpointInterval > 0 {
		ttl = 2 * time.Second
	}
	cp := newControlPlane(t, env, SystemClock{}, ttl, 3*time.Second)
	bucket, err := checkpoint.OpenObjectBucket(testCtx(t), env.js, bus.ObjectBucketCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	stores := func(key Key, _ ResidencyEpoch) checkpoint.Store {
		s, err := bucket.Session(key.Tenant, key.Session)
		if err != nil {
			t.Error(err)
		}
		return s
	}
	durable = newMemDurable()
	rec := &recorder{}
	cfg := func(id string) hostConfig {
		return hostConfig{id: id, cp: cp, env: env, durable: durable, runtime: newFakeRuntime(), target: target,
			handler: rec.handler(id), checkpoints: stores, checkpointInterval: base.checkpointInterval,
			checkpointPoll: base.checkpointPoll, hooks: base.hooks}
	}
	return newHost(t, cfg("host-a")), newHost(t, cfg("host-b")), durable, bucket
}

// TestManager_WorkspaceSurvivesMove (library level): a session's files,
// a symlink and an empty directory among them, are checkpointed by its
// release and restored byte for byte by the next attach on another host;
// the next release there sends only what changed.
func TestManager_WorkspaceSurvivesMove(t *testing.T) {
	ctx := testCtx(t)
	a, b, durable, _ := checkpointHosts(t, fakeTarget())
	key := Key{tenant, "moves"}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3<<20+17)
	_, _ = rand.Read(big)
	write := func(dir, name string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(ra.Workspace, "data/big.bin", big)
	write(ra.Workspace, "notes.txt", []byte("remember this"))
	if err := os.Symlink("data/big.bin", filepath.Join(ra.Workspace, "latest")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ra.Workspace, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := a.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	cps := durable.checkpoints()
	if len(cps) != 1 || cps[0].Content == nil || cps[0].Content.Files != 2 || cps[0].Content.Bytes != int64(len(big))+13 {
		t.Fatalf("first release committed %+v, want a checkpoint of 2 files", cps)
	}
	rb, err := b.mgr.Attach(ctx, request(key, ModeResume))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(rb.Workspace, "latest")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file through the symlink after the move: %d bytes, %v", len(got), err)
	}
	if info, err := os.Stat(filepath.Join(rb.Workspace, "empty")); err != nil || !info.IsDir() {
		t.Errorf("empty directory after the move: %v", err)
	}
	write(rb.Workspace, "notes.txt", []byte("remember this, and that"))
	if err := b.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	cps = durable.checkpoints()
	if second := cps[len(cps)-1].Content; second == nil || second.BytesMoved > 64<<10 || cps[len(cps)-1].Sequence != 2 {
		t.Errorf("second checkpoint %+v moved %+v, want only the changed note (and the manifest)", cps[len(cps)-1], second)
	}
}

// TestManager_RestoreRefusals: a damaged checkpoint fails the attach with
// its code and launches nothing; a target requiring a checkpoint refuses
// to resume a session that has none.
func TestManager_RestoreRefusals(t *testing.T) {
	ctx := testCtx(t)
	a, b, _, bucket := checkpointHosts(t, fakeTarget())
	key := Key{tenant, "damaged"}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ra.Workspace, "f"), bytes.Repeat([]byte{7}, 100<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	store, _ := bucket.Session(key.Tenant, key.Session)
	chunks, err := store.Chunks(ctx)
	if err != nil || len(chunks) == 0 {
		t.Fatalf("chunks: %v %v", chunks, err)
	}
	for _, c := range chunks {
		if err := store.PutChunk(ctx, c, checkpoint.Chunk{Data: []byte("not it")}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.mgr.Attach(ctx, request(key, ModeResume))
	var ae *AttachError
	if !errors.As(err, &ae) || ae.Code != Code(checkpoint.CodeCorrupt) || !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("attach over a damaged checkpoint: %v, want code %s", err, checkpoint.CodeCorrupt)
	}
	if ae.Step != StepWorkspace || len(ae.Unreleased) != 0 {
		t.Errorf("failed at %v leaving %v, want the workspace step, nothing held", ae.Step, ae.Unreleased)
	}
	if _, ok := b.mgr.Resident(key); ok {
		t.Error("the session is resident after a failed restore")
	}

	target := fakeTarget()
	target.RequiresCheckpoint = true
	bare := Key{tenant, "bare"}
	c, _, cDurable, _ := checkpointHosts(t, target)
	cDurable.seed(bare, compatA)
	_, err = c.mgr.Attach(ctx, request(bare, ModeResume))
	if !errors.As(err, &ae) || ae.Code != CodeCheckpointNeeded || !errors.Is(err, ErrCheckpointRequired) {
		t.Fatalf("resume without a workspace checkpoint on a target requiring one: %v, want %s", err, CodeCheckpointNeeded)
	}
}

// TestManager_RestorePreviousCheckpoint: when the latest checkpoint is
// damaged, the attach fails with its code and names the checkpoint before
// it, which an attach restores when asked (FromCheckpoint); a sequence not
// kept, or asked of a create, is refused.
func TestManager_RestorePreviousCheckpoint(t *testing.T) {
	ctx := testCtx(t)
	a, b, _, bucket := checkpointHosts(t, fakeTarget())
	key := Key{tenant, "twice"}
	store, _ := bucket.Session(key.Tenant, key.Session)
	write := func(r Residency, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(r.Workspace, "f"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	write(ra, "first")
	if err := a.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	before, err := store.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ra, err = a.mgr.Attach(ctx, request(key, ModeResume)); err != nil {
		t.Fatal(err)
	}
	write(ra, "second")
	if err := a.mgr.Release(ctx, key); err != nil {
		t.Fatal(err)
	}
	after, err := store.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Damage what only the latest checkpoint names.
	for _, c := range after {
		if !slices.Contains(before, c) {
			if err := store.PutChunk(ctx, c, checkpoint.Chunk{Data: []byte("not it")}); err != nil {
				t.Fatal(err)
			}
		}
	}

	_, err = b.mgr.Attach(ctx, request(key, ModeResume))
	var rerr *RestoreError
	if !errors.As(err, &rerr) || !errors.Is(err, checkpoint.ErrCorrupt) || rerr.Previous != 1 || rerr.Checkpoint.Sequence != 2 {
		t.Fatalf("attach over a damaged latest checkpoint: %v, want checkpoint 2 corrupt offering 1", err)
	}
	if w := ToWire(err); w.Code != Code(checkpoint.CodeCorrupt) || w.PreviousCheckpoint != 1 || !strings.Contains(w.Message, "--from-checkpoint 1") {
		t.Fatalf("on the wire: %+v", w)
	}
	var ae *AttachError
	for _, bad := range []struct {
		mode Mode
		from uint64
		want string
	}{
		{ModeResume, 7, "kept: 2, 1"},
		{ModeCreate, 1, "only a resume restores a checkpoint"},
	} {
		req := request(key, bad.mode)
		req.FromCheckpoint = bad.from
		if _, err := b.mgr.Attach(ctx, req); !errors.As(err, &ae) || ae.Code != CodeInvalidRequest || !strings.Contains(err.Error(), bad.want) || !ae.TookNothing() {
			t.Errorf("%s from checkpoint %d: %v, want invalid_request saying %q", bad.mode, bad.from, err, bad.want)
		}
	}
	req := request(key, ModeResume)
	req.FromCheckpoint = 1
	rb, err := b.mgr.Attach(ctx, req)
	if err != nil {
		t.Fatalf("attach from checkpoint 1: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(rb.Workspace, "f")); err != nil || string(got) != "first" {
		t.Fatalf("workspace restored from checkpoint 1: %q, %v", got, err)
	}
}

// TestManager_NodeLossRestoresCheckpoint (library level): a resident
// session is checkpointed every interval; its host is cut off from the
// control plane and surrenders without a release; the next host restores
// the last periodic checkpoint, which holds what was written before it.
func TestManager_NodeLossRestoresCheckpoint(t *testing.T) {
	ctx := testCtx(t)
	lost := make(chan LostResidency, 1)
	a, b, durable, _ := checkpointHostsWith(t, fakeTarget(), hostConfig{checkpointInterval: 100 * time.Millisecond,
		hooks: Hooks{OnLost: func(l LostResidency) { lost <- l }}})
	key := Key{tenant, "lossy"}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ra.Workspace, "progress"), []byte("epoch 41 done"), 0o600); err != nil {
		t.Fatal(err)
	}
	var taken Checkpoint
	waitFor(t, "a periodic checkpoint holding the file", 20*time.Second, func() bool {
		for _, cp := range durable.checkpoints() {
			if cp.Content != nil && cp.Content.Files == 1 {
				taken = cp
				return true
			}
		}
		return false
	})
	a.link.partition()
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("host A never gave its grant up")
	}
	var rb Residency
	waitFor(t, "host B to attach once the lease expired", 30*time.Second, func() bool {
		rb, err = b.mgr.Attach(ctx, request(key, ModeResume))
		return err == nil
	})
	if got, err := os.ReadFile(filepath.Join(rb.Workspace, "progress")); err != nil || string(got) != "epoch 41 done" {
		t.Fatalf("after the loss: %q, %v; want the file the periodic checkpoint %d held", got, err, taken.Sequence)
	}
	if st, _ := durable.LoadSessionState(ctx, key); st.CheckpointSequence < taken.Sequence || st.CheckpointEpoch != taken.Epoch {
		t.Errorf("durable state %+v, want the periodic checkpoint of epoch %d (sequence %d or later)", st, taken.Epoch, taken.Sequence)
	}
}

// TestManager_CheckpointOnRequest: a session that creates the request file
// gets a checkpoint (none are periodic here) and the answer file naming
// it; the request is taken, so it is answered once.
func TestManager_CheckpointOnRequest(t *testing.T) {
	ctx := testCtx(t)
	a, _, durable, _ := checkpointHostsWith(t, fakeTarget(), hostConfig{checkpointPoll: 20 * time.Millisecond})
	key := Key{tenant, "asks"}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ra.Workspace, "result"), []byte("42"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(ra.Workspace, ".warmfleet"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ra.Workspace, CheckpointRequestFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var done CheckpointDone
	waitFor(t, "the checkpoint asked for", 20*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(ra.Workspace, CheckpointDoneFile))
		return err == nil && json.Unmarshal(b, &done) == nil
	})
	cps := durable.checkpoints()
	if len(cps) != 1 || cps[0].Sequence != done.Sequence || cps[0].Epoch != done.Epoch || cps[0].Content == nil || cps[0].Content.Files != 1 {
		t.Fatalf("committed %+v, answered %+v; want the one checkpoint of the result file", cps, done)
	}
	if _, err := os.Stat(filepath.Join(ra.Workspace, CheckpointRequestFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the request is still there: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(durable.checkpoints()); n != 1 {
		t.Errorf("%d checkpoints after one request, want 1", n)
	}
}

// TestManager_WarmOutcomeFailures: a warm release that cannot checkpoint
// aborts, its outcome naming the step; one whose lease release fails
// after the runtime went is incomplete, naming that teardown.
func TestManager_WarmOutcomeFailures(t *testing.T) {
	ctx := testCtx(t)
	outcomes := make(chan WarmOutcome, 8)
	env := newBus(t)
	cp := newControlPlane(t, env, SystemClock{}, 10*time.Second, 3*time.Second)
	rec := &recorder{}
	h := newHost(t, hostConfig{id: "host-a", cp: cp, env: env, durable: newMemDurable(), runtime: newFakeRuntime(), target: fakeTarget(),
		handler: rec.handler("host-a"), warmTTL: 100 * time.Millisecond, hooks: Hooks{OnWarmRelease: func(o WarmOutcome) { outcomes <- o }}})
	key := Key{tenant, "warm-fails"}
	h.faults.inject("durable.checkpoint")
	if _, err := h.mgr.Attach(ctx, request(key, ModeCreate)); err != nil {
		t.Fatal(err)
	}
	next := func() WarmOutcome {
		t.Helper()
		select {
		case o := <-outcomes:
			return o
		case <-time.After(20 * time.Second):
			t.Fatal("no warm outcome")
			return WarmOutcome{}
		}
	}
	if o := next(); o.Kind != WarmAborted || len(o.Failures) != 1 || o.Failures[0].Step != "checkpoint" || o.Failures[0].Err == nil {
		t.Fatalf("outcome %+v, want aborted at the checkpoint", o)
	}
	h.faults.replace("leases.release")
	o := next()
	for o.Kind == WarmAborted {
		o = next()
	}
	if o.Kind != WarmIncomplete || len(o.Failures) != 1 || o.Failures[0].Step != "lease" {
		t.Fatalf("outcome %+v, want incomplete, the lease left", o)
	}
}

func TestChunkSizeFor(t *testing.T) {
	for _, c := range []struct{ payload, want int64 }{
		{1 << 20, ChunkSize},
		{8 << 20, ChunkSize},
		{512 << 10, 512<<10 - 16<<10},
		{10 << 10, checkpoint.MinChunkSize},
	} {
		if got := ChunkSizeFor(c.payload); got != c.want {
			t.Errorf("ChunkSizeFor(%d) = %d, want %d", c.payload, got, c.want)
		}
	}
}

// TestManager_UncommittedTakeNotPrevious: a checkpoint whose commit fails
// does not become the next one's previous manifest (its chunks are kept
// by no committed checkpoint, so they may be deleted); the next one, once
// committed, does.
func TestManager_UncommittedTakeNotPrevious(t *testing.T) {
	ctx := testCtx(t)
	a, _, _, _ := checkpointHosts(t, fakeTarget())
	key := Key{tenant, "uncommitted"}
	ra, err := a.mgr.Attach(ctx, request(key, ModeCreate))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ra.Workspace, "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.mgr.mu.Lock()
	s := a.mgr.sessions[key]
	a.mgr.mu.Unlock()
	a.faults.inject("durable.checkpoint")
	if _, err := s.checkpointResident(ctx, "asked"); err == nil {
		t.Fatal("checkpoint committed through an injected failure")
	}
	s.mu.Lock()
	prev := s.manifest
	s.mu.Unlock()
	if prev != nil {
		t.Fatalf("an uncommitted take became the previous manifest: %d entries", len(prev.Entries))
	}
	a.faults.clear()
	if _, err := s.checkpointResident(ctx, "asked"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	prev = s.manifest
	s.mu.Unlock()
	if prev == nil || len(prev.Entries) != 1 {
		t.Fatalf("the committed take is not the previous manifest: %+v", prev)
	}
}
