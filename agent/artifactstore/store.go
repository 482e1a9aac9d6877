package artifactstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

const (
	// tmpSuffix marks a sidecar being written; New removes leftovers.
	tmpSuffix = ".tmp"
	// copyBuffer is the unit of hashing and writing: large enough that a
	// fetch costs one write syscall per MiB.
	copyBuffer = 1 << 20
)

// Store holds an agent's artifact replicas under one directory:
//
//	blobs/sha256/<hex>         verified replicas, read-only (0444)
//	partial/sha256/<hex>       fetches in progress, resumed by the next Ensure
//	meta/sha256/<hex>.json     each replica's verified and last-used times
//
// The store fetches, verifies, lists and removes; what to collect is the
// agent's decision.
type Store struct {
	root    string
	retries int
	backoff time.Duration
	now     func() time.Time

	mu      sync.Mutex
	holds   map[string]int     // digest → workloads holding the replica
	flights map[string]*flight // digest → the one Ensure running for it
}

// Option tunes a Store.
type Option func(*Store)

// WithRetry sets how many times a fetch retries a transient source error
// (resuming each time) and the first backoff, doubled per retry up to 10s.
func WithRetry(retries int, backoff time.Duration) Option {
	return func(s *Store) { s.retries, s.backoff = max(retries, 0), max(backoff, 0) }
}

// New opens (creating) a store rooted at dir. Partial fetches are kept
// for resume; half-written sidecars are removed.
func New(dir string, opts ...Option) (*Store, error) {
	s := &Store{root: dir, retries: 5, backoff: 250 * time.Millisecond, now: time.Now,
		holds: map[string]int{}, flights: map[string]*flight{}}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{s.dir("blobs"), s.dir("partial"), s.dir("meta")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("artifactstore: %w", err)
		}
	}
	tmps, _ := filepath.Glob(filepath.Join(s.dir("meta"), "*"+tmpSuffix))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

func (s *Store) dir(kind string) string { return filepath.Join(s.root, kind, "sha256") }

// Path is where digest's verified replica lives (whether or not it does).
func (s *Store) Path(digest string) string {
	return filepath.Join(s.dir("blobs"), strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) partialPath(digest string) string {
	return filepath.Join(s.dir("partial"), strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) metaPath(digest string) string {
	return filepath.Join(s.dir("meta"), strings.TrimPrefix(digest, "sha256:")+".json")
}

// checkDigest refuses anything but sha256:<hex>, so a digest can never
// name a path outside the store.
func checkDigest(digest string) error {
	if err := schemas.ValidateSHA256("digest", digest); err != nil {
		return fmt.Errorf("artifactstore: %q is not a sha256 digest", digest)
	}
	return nil
}

// Hold marks digest in use by a workload until release is called (once;
// later calls do nothing). Remove refuses a held replica.
func (s *Store) Hold(digest string) (release func()) {
	s.mu.Lock()
	s.holds[digest]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.holds[digest]--; s.holds[digest] <= 0 {
				delete(s.holds, digest)
			}
			s.mu.Unlock()
		})
	}
}

// Remove deletes digest's replica, sidecar and partial fetch. It refuses
// with ErrInUse while the replica is held or being fetched, and answers
// ErrNotFound when there was nothing to remove.
func (s *Store) Remove(digest string) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holds[digest] > 0 {
		return fmt.Errorf("artifact %s: held by %d workload(s): %w", digest, s.holds[digest], ErrInUse)
	}
	if s.flights[digest] != nil {
		return fmt.Errorf("artifact %s: being fetched: %w", digest, ErrInUse)
	}
	found := false
	for _, p := range []string{s.Path(digest), s.partialPath(digest), s.metaPath(digest)} {
		err := os.Remove(p)
		if err == nil {
			found = true
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("artifact %s: remove: %w", digest, err)
		}
	}
	if !found {
		return fmt.Errorf("artifact %s: %w", digest, ErrNotFound)
	}
	return nil
}

// List reports the replicas on disk (verified when they were stored; a
// use re-verifies one whose seal no longer holds), sorted by digest.
func (s *Store) List() []schemas.ArtifactReplica {
	ents, _ := os.ReadDir(s.dir("blobs"))
	out := make([]schemas.ArtifactReplica, 0, len(ents))
	for _, e := range ents {
		digest := "sha256:" + e.Name()
		if !e.Type().IsRegular() || checkDigest(digest) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		r := schemas.ArtifactReplica{Digest: digest, SizeBytes: fi.Size(), VerifiedAt: fi.ModTime().UTC()}
		if m, err := readMeta(s.metaPath(digest), digest); err == nil {
			r.VerifiedAt, r.LastUsedAt = m.VerifiedAt, m.LastUsedAt
		}
		out = append(out, r)
	}
	return out
}

// Partial is a fetch in progress (or interrupted) on disk.
type Partial struct {
	Digest     string
	Bytes      int64
	ModifiedAt time.Time
}

// Partials reports the interrupted or running fetches on disk, so the
// agent can count and collect them.
func (s *Store) Partials() []Partial {
	ents, _ := os.ReadDir(s.dir("partial"))
	var out []Partial
	for _, e := range ents {
		digest := "sha256:" + e.Name()
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && checkDigest(digest) == nil {
			out = append(out, Partial{Digest: digest, Bytes: fi.Size(), ModifiedAt: fi.ModTime().UTC()})
		}
	}
	return out
}

// UsedBytes is what replicas and partial fetches take on disk.
func (s *Store) UsedBytes() int64 {
	var n int64
	for _, r := range s.List() {
		n += r.SizeBytes
	}
	for _, p := range s.Partials() {
		n += p.Bytes
	}
	return n
}

// Touch marks digest's replica used now.
func (s *Store) Touch(digest string) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	fi, err := os.Stat(s.Path(digest))
	if err != nil {
		return fmt.Errorf("artifact %s: %w", digest, ErrNotFound)
	}
	m, err := readMeta(s.metaPath(digest), digest)
	if err != nil {
		m = meta{Digest: digest, SizeBytes: fi.Size(), VerifiedAt: fi.ModTime().UTC()}
	}
	m.LastUsedAt = s.now().UTC()
	return writeMeta(s.metaPath(digest), m)
}

// Verify re-hashes digest's replica, whatever its seal says (a scrub). A replica that does not match is
// deleted (unless a fetch of it is running, which verifies on its own)
// and the error wraps ErrDigestMismatch; a missing one is ErrNotFound.
func (s *Store) Verify(ctx context.Context, digest string) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	ok, size, sl, err := hashSealed(ctx, s.Path(digest), digest)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("artifact %s: %w", digest, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("artifact %s: verify: %w", digest, err)
	}
	if !ok {
		s.mu.Lock()
		if s.flights[digest] == nil {
			_ = os.Remove(s.Path(digest))
			_ = os.Remove(s.metaPath(digest))
		}
		s.mu.Unlock()
		return fmt.Errorf("artifact %s: replica of %d bytes on disk does not hash to its digest: %w", digest, size, ErrDigestMismatch)
	}
	m, err := readMeta(s.metaPath(digest), digest)
	if err != nil {
		m = meta{Digest: digest}
	}
	m.SizeBytes, m.VerifiedAt, m.Seal = size, s.now().UTC(), sl
	return writeMeta(s.metaPath(digest), m)
}

// hashMatches hashes the file at path and reports whether it is digest.
func hashMatches(ctx context.Context, path, digest string) (bool, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := hashPrefix(ctx, f, h)
	if err != nil {
		return false, n, err
	}
	return "sha256:"+hex.EncodeToString(h.Sum(nil)) == digest, n, nil
}

// hashPrefix hashes r to its end in copyBuffer pieces, checking ctx
// between pieces (a replica may be tens of GB).
func hashPrefix(ctx context.Context, r io.Reader, h io.Writer) (int64, error) {
	buf := make([]byte, copyBuffer)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := readFull(r, buf)
		h.Write(buf[:n])
		total += int64(n)
		if err != nil {
			return total, err
		}
		if n < len(buf) {
			return total, nil
		}
	}
}

// readFull reads until b is full or r ends; the end is not an error.
func readFull(r io.Reader, b []byte) (int, error) {
	n, err := io.ReadFull(r, b)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	return n, err
}
