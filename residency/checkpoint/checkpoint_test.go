package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const testChunk = MinChunkSize

// sampleWorkspace builds a workspace with every kind of entry a session
// leaves: nested and empty directories, empty, small and multi-chunk
// files, modes (setuid among them, which a checkpoint drops), a sticky and
// a read-only directory, symlinks relative, absolute and dangling, and a
// fifo (not checkpointed).
func sampleWorkspace(t *testing.T, dir string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range []string{"a/b/c", "empty", "sticky", "ro"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(dir, "zero"), nil, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "a/small.txt"), []byte("hello\n"), 0o640))
	writeRandom(t, rng, filepath.Join(dir, "a/b/c/big.bin"), 3*testChunk+1234)
	writeRandom(t, rng, filepath.Join(dir, "a/exact.bin"), 2*testChunk)
	must(t, os.WriteFile(filepath.Join(dir, "a/log.txt"), []byte(strings.Repeat("a line of a log\n", 16000)), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "a-b"), []byte("sorts between a and a/"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Chmod(filepath.Join(dir, "suid"), 0o755|fs.ModeSetuid|fs.ModeSetgid))
	must(t, os.WriteFile(filepath.Join(dir, "ro/inside"), []byte("kept"), 0o444))
	must(t, os.Chmod(filepath.Join(dir, "ro"), 0o555))
	must(t, os.Chmod(filepath.Join(dir, "sticky"), 0o777|fs.ModeSticky))
	must(t, os.Symlink("b/c/big.bin", filepath.Join(dir, "a/link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "abs")))
	must(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	old := time.Date(2025, 3, 4, 5, 6, 7, 891011, time.UTC)
	must(t, os.Chtimes(filepath.Join(dir, "a/small.txt"), old, old))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sameTree fails unless got reproduces want: every path, kind, size,
// content, target, mtime and owner, and the mode without setuid/setgid.
func sameTree(t *testing.T, want, got map[string]treeEntry) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("%s: missing after restore", p)
			continue
		}
		w.mode &^= fs.ModeSetuid | fs.ModeSetgid
		if w != g {
			t.Errorf("%s: restored as %+v, want %+v", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: restored but not in the workspace", p)
		}
	}
}

func TestTakeRestoreRoundTrip(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	src := filepath.Join(t.TempDir(), "ws")
	must(t, os.Mkdir(src, 0o700))
	sampleWorkspace(t, src)
	m, st, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	if st.SkippedCount != 1 || len(st.Skipped) != 1 || st.Skipped[0] != "fifo" {
		t.Errorf("skipped %d %v, want the fifo", st.SkippedCount, st.Skipped)
	}
	if st.Files != 8 || st.Symlinks != 3 || st.Dirs != 6 {
		t.Errorf("took %d files, %d symlinks, %d dirs; want 8, 3, 6", st.Files, st.Symlinks, st.Dirs)
	}
	// big.bin 4 chunks, exact.bin 2, log.txt 4, four small files one
	// each; the log's first three chunks are the same, sent once.
	if st.Chunks != 4+2+4+4 || st.ChunksMoved != st.Chunks-2 || st.Bytes != m.Bytes() {
		t.Errorf("chunks %d (moved %d), bytes %d (manifest %d)", st.Chunks, st.ChunksMoved, st.Bytes, m.Bytes())
	}
	// The log compresses; the random files cannot.
	if random := int64(5*testChunk + 1234); st.BytesMoved >= st.Bytes || st.BytesMoved < random {
		t.Errorf("moved %d bytes of %d (%d of them random)", st.BytesMoved, st.Bytes, random)
	}
	want := tree(t, src)
	dst := filepath.Join(t.TempDir(), "tenant", "restored")
	got, rst, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, dst, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rst.Bytes != st.Bytes || rst.Files != st.Files || len(got.Entries) != len(m.Entries) {
		t.Errorf("restored %+v of %+v", rst, st)
	}
	sameTree(t, want, tree(t, dst))
	if info, err := os.Stat(dst); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("workspace root: %v %v, want a 0700 directory", info, err)
	}
}

// TestRestoreReplacesWhole: a restore over an existing workspace leaves
// exactly the checkpoint's files, and no staging directory behind.
func TestRestoreReplacesWhole(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "kept"), []byte("v1"), 0o600))
	if _, _, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{}); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	dst := filepath.Join(parent, "ws")
	must(t, os.Mkdir(dst, 0o700))
	must(t, os.WriteFile(filepath.Join(dst, "stale"), []byte("from an old holder"), 0o600))
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, dst, 0); err != nil {
		t.Fatal(err)
	}
	sameTree(t, tree(t, src), tree(t, dst))
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 {
		t.Errorf("parent holds %v, want only the workspace", entries)
	}
}

// TestIncrementalTakeMovesOnlyChanges: after a small change to a large
// workspace the next checkpoint moves under 1 % of it and reads only the
// changed file; both checkpoints restore.
func TestIncrementalTakeMovesOnlyChanges(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	src := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	const files, size = 16, 1 << 20
	for i := range files {
		writeRandom(t, rng, filepath.Join(src, "f"+string(rune('a'+i))), size)
	}
	first, st1, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	v1 := tree(t, src)
	f, err := os.OpenFile(filepath.Join(src, "fc"), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte(strings.Repeat("changed!", 1000)), 1<<19+100)
	must(t, errors.Join(err, f.Close()))
	_, st2, err := Take(ctx, src, store, ID{Sequence: 2, Epoch: 1}, Options{ChunkSize: testChunk, Previous: &first})
	if err != nil {
		t.Fatal(err)
	}
	total := int64(files * size)
	if st1.BytesMoved < total {
		t.Errorf("first take moved %d bytes of %d random ones", st1.BytesMoved, total)
	}
	if st2.BytesMoved*100 >= total || st2.ChunksMoved != 1 || st2.BytesRead != size {
		t.Errorf("second take moved %d bytes (%d chunks), read %d, of a %d-byte workspace with 8000 bytes changed",
			st2.BytesMoved, st2.ChunksMoved, st2.BytesRead, total)
	}
	for seq, want := range map[uint64]map[string]treeEntry{1: v1, 2: tree(t, src)} {
		dst := filepath.Join(t.TempDir(), "ws")
		if _, _, err := Restore(ctx, store, ID{Sequence: seq, Epoch: 1}, dst, 0); err != nil {
			t.Fatal(err)
		}
		sameTree(t, want, tree(t, dst))
	}
}

// TestDamagedCheckpointRefused: a chunk replaced, cut short or missing is
// found on restore with its code; the workspace there stays as it was,
// nothing half-restored is left, and the previous checkpoint restores.
func TestDamagedCheckpointRefused(t *testing.T) {
	ctx := ctxT(t)
	js := startBucket(t)
	src := t.TempDir()
	writeRandom(t, rand.New(rand.NewPCG(5, 6)), filepath.Join(src, "data"), 3*testChunk)
	for _, tc := range []struct {
		name   string
		damage func(s *ObjectStore, digest string, c Chunk) error
		want   error
	}{
		{"other content", func(s *ObjectStore, d string, c Chunk) error {
			bad := append([]byte(nil), c.Data...)
			bad[len(bad)/2] ^= 0xff
			return s.PutChunk(ctx, d, Chunk{Data: bad})
		}, ErrCorrupt},
		{"truncated", func(s *ObjectStore, d string, c Chunk) error {
			return s.PutChunk(ctx, d, Chunk{Data: c.Data[:len(c.Data)/2]})
		}, ErrCorrupt},
		{"not the encoding it claims", func(s *ObjectStore, d string, c Chunk) error {
			return s.PutChunk(ctx, d, Chunk{Data: c.Data, Compressed: true})
		}, ErrCorrupt},
		{"missing", func(s *ObjectStore, d string, _ Chunk) error { return s.DeleteChunk(ctx, d) }, ErrIncomplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := sessionStore(t, js, "acme", strings.ReplaceAll(tc.name, " ", "-"))
			if _, _, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk}); err != nil {
				t.Fatal(err)
			}
			must(t, os.WriteFile(filepath.Join(src, "data2"), []byte("second"), 0o600))
			defer os.Remove(filepath.Join(src, "data2"))
			m, _, err := Take(ctx, src, store, ID{Sequence: 2, Epoch: 1}, Options{ChunkSize: testChunk})
			if err != nil {
				t.Fatal(err)
			}
			// Damage the chunk only checkpoint 2 names.
			d := m.Entries[1].Chunks[0]
			c, err := store.GetChunk(ctx, d)
			must(t, err)
			if c.Compressed || c.Verified {
				t.Fatalf("a random chunk in one message came back compressed %v, verified %v", c.Compressed, c.Verified)
			}
			must(t, tc.damage(store, d, c))
			parent := t.TempDir()
			dst := filepath.Join(parent, "ws")
			must(t, os.Mkdir(dst, 0o700))
			must(t, os.WriteFile(filepath.Join(dst, "before"), []byte("untouched"), 0o600))
			_, _, err = Restore(ctx, store, ID{Sequence: 2, Epoch: 1}, dst, 0)
			var ce *Error
			if !errors.Is(err, tc.want) || !errors.As(err, &ce) {
				t.Fatalf("restore of a damaged checkpoint: %v, want %v", err, tc.want)
			}
			if b, err := os.ReadFile(filepath.Join(dst, "before")); err != nil || string(b) != "untouched" {
				t.Errorf("the workspace was changed: %q %v", b, err)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 1 {
				t.Errorf("left behind: %v", entries)
			}
			if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, dst, 0); err != nil {
				t.Errorf("the previous checkpoint: %v", err)
			}
		})
	}
}

func TestPruneKeepsNewest(t *testing.T) {
	ctx := ctxT(t)
	js := startBucket(t)
	store := sessionStore(t, js, "acme", "s1")
	other := sessionStore(t, js, "acme", "s2")
	src := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 8))
	var prev *Manifest
	trees := map[uint64]map[string]treeEntry{}
	for seq := uint64(1); seq <= 4; seq++ {
		writeRandom(t, rng, filepath.Join(src, "f"), testChunk+int(seq))
		m, _, err := Take(ctx, src, store, ID{Sequence: seq, Epoch: 1}, Options{ChunkSize: testChunk, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		prev, trees[seq] = &m, tree(t, src)
	}
	if _, _, err := Take(ctx, src, other, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk}); err != nil {
		t.Fatal(err)
	}
	must(t, store.PutChunk(ctx, strings.Repeat("ab", 32), Chunk{Data: []byte("orphan of a failed take")}))
	st, err := Prune(ctx, store, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := store.IDs(ctx); len(ids) != 2 || ids[0] != (ID{3, 1}) || ids[1] != (ID{4, 1}) {
		t.Errorf("kept %v, want checkpoints 3 and 4", ids)
	}
	if st.Manifests != 2 || st.Chunks != 2*3+1 {
		t.Errorf("pruned %+v, want 2 manifests and 7 chunks (two of its file and a manifest piece each, and the orphan)", st)
	}
	for _, seq := range []uint64{3, 4} {
		dst := filepath.Join(t.TempDir(), "ws")
		if _, _, err := Restore(ctx, store, ID{Sequence: seq, Epoch: 1}, dst, 0); err != nil {
			t.Fatal(err)
		}
		sameTree(t, trees[seq], tree(t, dst))
	}
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, filepath.Join(t.TempDir(), "ws"), 0); !errors.Is(err, ErrIncomplete) {
		t.Errorf("a pruned checkpoint: %v, want %v", err, ErrIncomplete)
	}
	if _, _, err := Restore(ctx, other, ID{Sequence: 1, Epoch: 1}, filepath.Join(t.TempDir(), "ws"), 0); err != nil {
		t.Errorf("another session's checkpoint after a prune: %v", err)
	}
	if _, err := Prune(ctx, store, 0); err == nil {
		t.Error("prune keeping none was allowed")
	}
}

// TestChunksOverOneMessage: a chunk larger than a message is stored in
// several, read through ObjectStore.Get (which checks the object's own
// digest, so the chunk comes Verified), and damage is still found.
func TestChunksOverOneMessage(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	store.maxMessage = 4096
	src := t.TempDir()
	writeRandom(t, rand.New(rand.NewPCG(9, 10)), filepath.Join(src, "data"), 2*testChunk)
	m, _, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Entries[0].Chunks[1]
	c, err := store.GetChunk(ctx, d)
	if err != nil || !c.Verified || c.Compressed || len(c.Data) != testChunk {
		t.Fatalf("chunk over several messages: %d bytes, verified %v, compressed %v, %v", len(c.Data), c.Verified, c.Compressed, err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, dst, 0); err != nil {
		t.Fatal(err)
	}
	sameTree(t, tree(t, src), tree(t, dst))
	c.Data[0] ^= 1
	must(t, store.PutChunk(ctx, d, c))
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, filepath.Join(t.TempDir(), "ws"), 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore of a damaged chunk over several messages: %v, want %v", err, ErrCorrupt)
	}
}

// TestManifestInPieces: a manifest larger than a chunk is stored in
// pieces and read back whole; a damaged record or a missing piece is
// refused with its code.
func TestManifestInPieces(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	src := t.TempDir()
	for i := range 3000 {
		must(t, os.WriteFile(filepath.Join(src, fmt.Sprintf("f%05d", i)), []byte(fmt.Sprint(i)), 0o600))
	}
	if _, _, err := Take(ctx, src, store, ID{Sequence: 1, Epoch: 1}, Options{ChunkSize: testChunk}); err != nil {
		t.Fatal(err)
	}
	ix, err := loadIndex(ctx, store, ID{Sequence: 1, Epoch: 1})
	if err != nil || len(ix.Pieces) < 2 {
		t.Fatalf("manifest of 3000 files in %d pieces (%v), want several", len(ix.Pieces), err)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, dst, 0); err != nil {
		t.Fatal(err)
	}
	sameTree(t, tree(t, src), tree(t, dst))
	must(t, store.DeleteChunk(ctx, ix.Pieces[1]))
	if _, err := Load(ctx, store, ID{Sequence: 1, Epoch: 1}); !errors.Is(err, ErrIncomplete) {
		t.Errorf("a missing manifest piece: %v, want %v", err, ErrIncomplete)
	}
	must(t, store.PutManifest(ctx, ID{Sequence: 1, Epoch: 1}, []byte(`{"manifest_pieces":["nope"],"manifest_bytes":4}`)))
	if _, err := Load(ctx, store, ID{Sequence: 1, Epoch: 1}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a damaged record: %v, want %v", err, ErrCorrupt)
	}
}

// TestSameSequenceTwoEpochs: a stale holder and its successor that both
// take sequence 2 write two records; each restores its own.
func TestSameSequenceTwoEpochs(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	stale, successor := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(stale, "f"), []byte("the stale holder's"), 0o600))
	must(t, os.WriteFile(filepath.Join(successor, "f"), []byte("the successor's"), 0o600))
	for _, tc := range []struct {
		dir string
		id  ID
	}{{successor, ID{2, 2}}, {stale, ID{2, 1}}} {
		if _, _, err := Take(ctx, tc.dir, store, tc.id, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		dir string
		id  ID
	}{{successor, ID{2, 2}}, {stale, ID{2, 1}}} {
		dst := filepath.Join(t.TempDir(), "ws")
		if _, _, err := Restore(ctx, store, tc.id, dst, 0); err != nil {
			t.Fatal(err)
		}
		sameTree(t, tree(t, tc.dir), tree(t, dst))
	}
}

// TestForgetKeepsShared: forgetting a checkpoint deletes its record and
// the chunks only it named; what a kept checkpoint shares stays, and a
// forget run again after it finished deletes nothing more.
func TestForgetKeepsShared(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	src := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 12))
	writeRandom(t, rng, filepath.Join(src, "same"), 2*testChunk)
	writeRandom(t, rng, filepath.Join(src, "changes"), testChunk)
	first, _, err := Take(ctx, src, store, ID{1, 1}, Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	writeRandom(t, rng, filepath.Join(src, "changes"), testChunk)
	if _, _, err := Take(ctx, src, store, ID{2, 1}, Options{ChunkSize: testChunk, Previous: &first}); err != nil {
		t.Fatal(err)
	}
	st, err := Forget(ctx, store, []ID{{1, 1}}, []ID{{2, 1}})
	if err != nil {
		t.Fatal(err)
	}
	// The old "changes" chunk and checkpoint 1's manifest piece.
	if st.Manifests != 1 || st.Chunks != 2 {
		t.Errorf("forgot %+v, want 1 record and 2 chunks", st)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if _, _, err := Restore(ctx, store, ID{2, 1}, dst, 0); err != nil {
		t.Fatal(err)
	}
	sameTree(t, tree(t, src), tree(t, dst))
	if _, err := Load(ctx, store, ID{1, 1}); !errors.Is(err, ErrIncomplete) {
		t.Errorf("a forgotten checkpoint: %v, want %v", err, ErrIncomplete)
	}
	if st, err := Forget(ctx, store, []ID{{1, 1}}, []ID{{2, 1}}); err != nil || st.Chunks != 0 {
		t.Errorf("forget again: %+v, %v; want nothing more deleted", st, err)
	}
}
