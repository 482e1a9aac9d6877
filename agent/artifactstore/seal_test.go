package artifactstore

import (
	"errors"
	"os"
	"testing"
	"time"
)

// A use of an unchanged replica trusts its seal (no re-hash: the verified
// time stays the fetch's); a changed one is re-hashed and refused, even when
// the change restores the size and mtime.
func TestEnsureTrustsSealUntilReplicaChanges(t *testing.T) {
	b, digest := content(t, 2<<20)
	srv := serveContent(t, b, 0)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newStore(t)
	s.now = func() time.Time { return clock }
	w := Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)}
	first, err := s.Ensure(ctxT(t), w)
	if err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	again, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: w.SizeBytes})
	if err != nil || !again.AlreadyPresent || !again.Verified.Equal(first.Verified) {
		t.Fatalf("sealed use %+v, %v: want the fetch's verification (%s) kept", again, err, first.Verified)
	}
	if l := s.List(); len(l) != 1 || !l[0].LastUsedAt.Equal(clock) {
		t.Fatalf("list %+v: want last used %s", l, clock)
	}

	// Same size, mtime put back: only ctime tells.
	fi, err := os.Stat(first.Path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // ctime is at least this coarse
	flipByte(t, first.Path, 4242)
	if err := os.Chmod(first.Path, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(first.Path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: w.SizeBytes}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("use of a changed replica without a source: %v, want it re-hashed, removed and not found", err)
	}
	if _, err := os.Stat(first.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("changed replica still on disk: %v", err)
	}
	res, err := s.Ensure(ctxT(t), w)
	if err != nil || res.FetchedBytes != w.SizeBytes {
		t.Fatalf("refetch %+v, %v", res, err)
	}
	fileEquals(t, res.Path, b)
}

// A replica whose sidecar has no seal (written before seals, or hashed
// while it changed) is re-hashed at use, and sealed then.
func TestEnsureSealsUnsealedReplica(t *testing.T) {
	b, digest := content(t, 1<<20)
	srv := serveContent(t, b, 0)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newStore(t)
	s.now = func() time.Time { return clock }
	w := Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)}
	if _, err := s.Ensure(ctxT(t), w); err != nil {
		t.Fatal(err)
	}
	m, err := readMeta(s.metaPath(digest), digest)
	if err != nil || m.Seal == nil {
		t.Fatalf("meta after fetch %+v, %v: want a seal", m, err)
	}
	m.Seal = nil
	if err := writeMeta(s.metaPath(digest), m); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: w.SizeBytes})
	if err != nil || !res.Verified.Equal(clock) {
		t.Fatalf("unsealed use %+v, %v: want re-hashed at %s", res, err, clock)
	}
	if m, err := readMeta(s.metaPath(digest), digest); err != nil || m.Seal == nil {
		t.Fatalf("meta after re-hash %+v, %v: want sealed", m, err)
	}
}
