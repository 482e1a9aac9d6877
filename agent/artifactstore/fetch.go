package artifactstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progressEvery bounds how often a Want's Progress is called.
const progressEvery = 500 * time.Millisecond

// Want is the replica an Ensure asks for.
type Want struct {
	Digest    string // sha256:<hex>
	SizeBytes int64
	// Source serves the bytes when they must be fetched. Concurrent
	// Ensures of one digest share the first one's Source. Nil: only a
	// replica already on disk (verified) will do; else ErrNotFound.
	Source Source
	// Progress, when set, is told the bytes on disk and the total at most
	// every 500ms while fetching, and once at the end.
	Progress func(done, total int64)
}

// Result is what an Ensure found or did.
type Result struct {
	// Path is the verified, read-only replica.
	Path string
	// FetchedBytes came from the source during this Ensure.
	FetchedBytes int64
	// AlreadyPresent: a replica was on disk and verified; nothing fetched.
	AlreadyPresent bool
	// Verified is when the replica was last hashed and matched.
	Verified time.Time
	// Refetched: a replica on disk did not verify, was deleted, and was
	// fetched again.
	Refetched bool
}

// flight is the one Ensure of a digest running in this process; callers
// of the same digest wait for it. It runs under its own context, cancelled
// when every waiter has gone, so one caller's cancellation does not fail
// the others.
type flight struct {
	done      chan struct{}
	cancel    context.CancelFunc
	waiters   int  // guarded by Store.mu
	abandoned bool // guarded by Store.mu: cancelled, winding down
	res       Result
	err       error

	mu       sync.Mutex
	nextID   int
	progress map[int]func(done, total int64) // of the waiters still waiting
}

func (f *flight) report(done, total int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.progress {
		p(done, total)
	}
}

// watch adds a waiter's Progress; the returned func removes it.
func (f *flight) watch(p func(done, total int64)) (unwatch func()) {
	if p == nil {
		return func() {}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.nextID
	f.nextID++
	f.progress[id] = p
	return func() {
		f.mu.Lock()
		delete(f.progress, id)
		f.mu.Unlock()
	}
}

// Ensure makes a verified replica of w.Digest present and returns its
// path. A replica on disk is handed out as is while its stat still equals
// the seal taken when it was last hashed; otherwise it is re-hashed first
// (a replica changed on disk must be caught at use), and one that does not
// match is deleted and fetched again. A fetch
// streams into partial/, hashing as it writes, resumes a partial left by
// an earlier attempt, retries transient source errors with backoff, and
// moves the file into blobs/ only when size and sha256 match; otherwise the
// bytes are deleted and the error wraps ErrDigestMismatch. Concurrent
// Ensures of one digest share one verification or fetch.
func (s *Store) Ensure(ctx context.Context, w Want) (Result, error) {
	if err := checkDigest(w.Digest); err != nil {
		return Result{}, err
	}
	if w.SizeBytes < 0 {
		return Result{}, fmt.Errorf("artifact %s: negative size %d", w.Digest, w.SizeBytes)
	}
	s.mu.Lock()
	f := s.flights[w.Digest]
	for f != nil && f.abandoned {
		// A flight every waiter left is still stopping; it owns the
		// partial until it has, so wait and start a fresh one.
		s.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return Result{}, fmt.Errorf("artifact %s: %w", w.Digest, ctx.Err())
		}
		s.mu.Lock()
		f = s.flights[w.Digest]
	}
	var start func()
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{done: make(chan struct{}), cancel: cancel, progress: map[int]func(done, total int64){}}
		s.flights[w.Digest] = f
		start = func() { go s.run(fctx, f, w) }
	}
	f.waiters++
	unwatch := f.watch(w.Progress) // before the flight starts: no report missed
	defer unwatch()
	if start != nil {
		start()
	}
	s.mu.Unlock()

	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		s.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			f.abandoned = true
			f.cancel() // nobody wants it any more: stop; the partial stays
		}
		s.mu.Unlock()
		return Result{}, fmt.Errorf("artifact %s: %w", w.Digest, ctx.Err())
	}
}

// run is a flight's goroutine; it ends when the ensure does, which its
// context (cancelled when the last waiter leaves) bounds.
func (s *Store) run(ctx context.Context, f *flight, w Want) {
	res, err := s.ensure(ctx, w, f.report)
	s.mu.Lock()
	delete(s.flights, w.Digest)
	s.mu.Unlock()
	f.res, f.err = res, err
	f.cancel()
	close(f.done)
}

func (s *Store) ensure(ctx context.Context, w Want, progress func(done, total int64)) (Result, error) {
	blob := s.Path(w.Digest)
	refetched := false
	if m, err := readMeta(s.metaPath(w.Digest), w.Digest); err == nil && sealHolds(blob, m, w.SizeBytes) {
		// Unchanged since it was hashed: no need to read it again.
		m.LastUsedAt = s.now().UTC()
		if err := writeMeta(s.metaPath(w.Digest), m); err != nil {
			return Result{}, err
		}
		progress(w.SizeBytes, w.SizeBytes)
		return Result{Path: blob, AlreadyPresent: true, Verified: m.VerifiedAt}, nil
	}
	ok, size, sl, err := hashSealed(ctx, blob, w.Digest)
	switch {
	case err == nil && ok && size == w.SizeBytes:
		now := s.now().UTC()
		if err := writeMeta(s.metaPath(w.Digest), meta{Digest: w.Digest, SizeBytes: size, VerifiedAt: now, LastUsedAt: now, Seal: sl}); err != nil {
			return Result{}, err
		}
		progress(size, size)
		return Result{Path: blob, AlreadyPresent: true, Verified: now}, nil
	case err == nil && ok:
		// The bytes are right; the size asked for is not. Keep them.
		return Result{}, errSize(w.Digest, size, w.SizeBytes)
	case err == nil:
		// On disk but not these bytes: never hand it out.
		refetched = true
		if err := os.Remove(blob); err != nil {
			return Result{}, fmt.Errorf("artifact %s: remove corrupt replica: %w", w.Digest, err)
		}
		_ = os.Remove(s.metaPath(w.Digest))
	case !errors.Is(err, os.ErrNotExist):
		return Result{}, fmt.Errorf("artifact %s: verify replica: %w", w.Digest, err)
	}
	if w.Source == nil {
		return Result{}, fmt.Errorf("artifact %s: no verified replica and no source: %w", w.Digest, ErrNotFound)
	}
	fetched, err := s.fetch(ctx, w, progress)
	if err != nil {
		return Result{}, err
	}
	now := s.now().UTC()
	m := meta{Digest: w.Digest, SizeBytes: w.SizeBytes, VerifiedAt: now, LastUsedAt: now}
	// Hashed while written; sealed as it lies now, read-only in blobs/.
	if sl, err := sealOf(blob); err == nil {
		m.Seal = &sl
	}
	if err := writeMeta(s.metaPath(w.Digest), m); err != nil {
		return Result{}, err
	}
	return Result{Path: blob, FetchedBytes: fetched, Verified: now, Refetched: refetched}, nil
}

// fetch brings w's bytes into partial/, verifies them and moves them into
// blobs/. It returns the bytes read from the source.
func (s *Store) fetch(ctx context.Context, w Want, progress func(done, total int64)) (int64, error) {
	part := s.partialPath(w.Digest)
	file, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 0, fmt.Errorf("artifact %s: partial: %w", w.Digest, err)
	}
	defer file.Close()
	discard := func() { _ = file.Close(); _ = os.Remove(part) }

	// A partial left by an interrupted fetch is hashed to resume the sum
	// where it stopped; the file offset ends at its end.
	h := sha256.New()
	off, err := hashPrefix(ctx, file, h)
	if err != nil {
		return 0, fmt.Errorf("artifact %s: partial: %w", w.Digest, err)
	}
	if off > w.SizeBytes {
		if off, err = restart(file, h); err != nil {
			return 0, fmt.Errorf("artifact %s: partial: %w", w.Digest, err)
		}
	}

	last := time.Now()
	report := func(done int64, force bool) {
		if now := time.Now(); force || now.Sub(last) >= progressEvery {
			last = now
			progress(done, w.SizeBytes)
		}
	}
	// kept: bytes on disk from an earlier fetch. If the whole does not
	// match, they may be what is wrong, so the fetch starts over once.
	kept := off > 0
	var fetched int64
	for {
		n, err := s.download(ctx, w, file, h, off, report)
		fetched += n
		if err != nil {
			if errors.Is(err, ErrDigestMismatch) {
				discard()
			}
			return fetched, err
		}
		report(w.SizeBytes, true)
		sum := "sha256:" + hex.EncodeToString(h.Sum(nil))
		if sum == w.Digest {
			break
		}
		if !kept {
			discard()
			return fetched, fmt.Errorf("artifact %s: fetched bytes hash to %s: %w", w.Digest, sum, ErrDigestMismatch)
		}
		kept = false
		if off, err = restart(file, h); err != nil {
			return fetched, fmt.Errorf("artifact %s: partial: %w", w.Digest, err)
		}
	}
	if err := file.Chmod(0o444); err != nil {
		return fetched, fmt.Errorf("artifact %s: %w", w.Digest, err)
	}
	if err := file.Close(); err != nil {
		return fetched, fmt.Errorf("artifact %s: %w", w.Digest, err)
	}
	if err := os.Rename(part, s.Path(w.Digest)); err != nil {
		return fetched, fmt.Errorf("artifact %s: %w", w.Digest, err)
	}
	return fetched, nil
}

// download appends the source's bytes from off until the partial holds
// w.SizeBytes, resuming after transient errors (bounded, with backoff) and
// starting over when the source cannot resume. It returns the bytes read
// from the source.
func (s *Store) download(ctx context.Context, w Want, file *os.File, h hash.Hash, off int64, report func(int64, bool)) (int64, error) {
	var fetched int64
	backoff := s.backoff
	for failures := 0; off < w.SizeBytes; {
		n, err := s.copyFrom(ctx, w, file, h, off, report)
		off += n
		fetched += n
		switch {
		case err == nil && off < w.SizeBytes:
			// A clean end short of the size is the source's whole content
			// (a cut stream ends with an error instead).
			return fetched, errSize(w.Digest, off, w.SizeBytes)
		case errors.Is(err, ErrNoResume) && off > 0:
			if off, err = restart(file, h); err != nil {
				return fetched, fmt.Errorf("artifact %s: partial: %w", w.Digest, err)
			}
			continue
		case errors.Is(err, ErrSizeMismatch):
			return fetched, err
		case err == nil:
			return fetched, nil
		case ctx.Err() != nil:
			return fetched, fmt.Errorf("artifact %s: fetch stopped at byte %d: %w", w.Digest, off, ctx.Err())
		case isPermanent(err) || failures >= s.retries:
			return fetched, fmt.Errorf("artifact %s: fetch failed at byte %d after %d attempt(s): %w", w.Digest, off, failures+1, err)
		}
		failures++
		select {
		case <-ctx.Done():
			return fetched, fmt.Errorf("artifact %s: fetch stopped at byte %d: %w", w.Digest, off, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	return fetched, nil
}

// copyFrom opens the source at off and appends what it serves to file and
// h until it ends, fails, or passes the artifact's size. It returns the
// bytes appended; they are kept whatever the error, for the next resume.
//
// Two buffers overlap the work: the source fills one while a writer
// goroutine, owned by this call and joined before it returns, hashes and
// writes the other.
func (s *Store) copyFrom(ctx context.Context, w Want, file *os.File, h hash.Hash, off int64, report func(done int64, force bool)) (int64, error) {
	rc, err := w.Source.Open(ctx, off)
	if err != nil {
		return 0, err
	}
	defer rc.Close()

	free := make(chan []byte, 2)
	free <- make([]byte, copyBuffer)
	free <- make([]byte, copyBuffer)
	full := make(chan []byte, 2)
	done := make(chan struct{})
	var failed atomic.Bool
	var written int64 // the writer's until done closes
	var werr error
	go func() {
		defer close(done)
		for b := range full {
			if werr == nil {
				if _, err := file.Write(b); err != nil {
					werr = fmt.Errorf("write partial: %w", err)
					failed.Store(true)
				} else {
					h.Write(b)
					written += int64(len(b))
					report(off+written, false)
				}
			}
			free <- b[:cap(b)]
		}
	}()

	var read int64
	var rerr error
	for !failed.Load() {
		buf := <-free
		k, eof, err := fill(rc, buf)
		if off+read+int64(k) > w.SizeBytes {
			rerr = errSize(w.Digest, off+read+int64(k), w.SizeBytes)
			break
		}
		read += int64(k)
		if k > 0 {
			full <- buf[:k]
		} else {
			free <- buf
		}
		if err != nil || eof {
			rerr = err
			break
		}
	}
	close(full)
	<-done
	if werr != nil {
		return written, werr
	}
	return written, rerr
}

// fill reads until buf is full or r ends (eof), so each write is large;
// only io.EOF is an end, a truncated stream (io.ErrUnexpectedEOF) is an
// error.
func fill(r io.Reader, buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// restart empties the partial for a fetch from byte 0.
func restart(file *os.File, h hash.Hash) (int64, error) {
	h.Reset()
	if err := file.Truncate(0); err != nil {
		return 0, err
	}
	_, err := file.Seek(0, io.SeekStart)
	return 0, err
}
