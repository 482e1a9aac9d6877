package artifactstore

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestEnsureURLFetchesAndVerifies(t *testing.T) {
	b, digest := content(t, 3<<20+17)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	var calls int
	var lastDone, lastTotal int64
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL+"/w", nil),
		Progress: func(done, total int64) { calls, lastDone, lastTotal = calls+1, done, total }})
	if err != nil {
		t.Fatal(err)
	}
	if res.AlreadyPresent || res.Refetched || res.FetchedBytes != int64(len(b)) || res.Verified.IsZero() {
		t.Fatalf("result %+v", res)
	}
	if calls == 0 || lastDone != int64(len(b)) || lastTotal != int64(len(b)) {
		t.Fatalf("progress: %d calls, last %d/%d", calls, lastDone, lastTotal)
	}
	fileEquals(t, res.Path, b)
	fi, err := os.Stat(res.Path)
	if err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("replica mode %v, %v", fi.Mode(), err)
	}
	if len(s.Partials()) != 0 {
		t.Fatalf("partials left: %v", s.Partials())
	}

	again, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL+"/w", nil)})
	if err != nil || !again.AlreadyPresent || again.FetchedBytes != 0 || again.Path != res.Path {
		t.Fatalf("second ensure %+v, %v", again, err)
	}
	if srv.requests.Load() != 1 {
		t.Fatalf("%d requests, want 1", srv.requests.Load())
	}
	list := s.List()
	if len(list) != 1 || list[0].Digest != digest || list[0].SizeBytes != int64(len(b)) || list[0].VerifiedAt.IsZero() || list[0].LastUsedAt.IsZero() {
		t.Fatalf("list %+v", list)
	}
	if s.UsedBytes() != int64(len(b)) {
		t.Fatalf("used %d", s.UsedBytes())
	}
}

func TestEnsureWrongBytesAreDiscarded(t *testing.T) {
	b, digest := content(t, 1<<20)
	other, _ := content(t, len(b))
	for name, served := range map[string][]byte{"same size": other, "longer": append(append([]byte(nil), b...), 'x'), "shorter": b[:len(b)-1]} {
		t.Run(name, func(t *testing.T) {
			srv := serveContent(t, served, 0)
			s := newStore(t)
			_, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)})
			if !errors.Is(err, ErrDigestMismatch) {
				t.Fatalf("err %v, want ErrDigestMismatch", err)
			}
			if name == "longer" && !errors.Is(err, ErrSizeMismatch) {
				t.Fatalf("err %v, want ErrSizeMismatch", err)
			}
			if !strings.Contains(err.Error(), digest) {
				t.Fatalf("error does not name the digest: %v", err)
			}
			if len(s.List()) != 0 || len(s.Partials()) != 0 {
				t.Fatalf("left behind: %v %v", s.List(), s.Partials())
			}
		})
	}
}

func TestEnsureRefetchesCorruptReplica(t *testing.T) {
	b, digest := content(t, 2<<20)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	w := Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)}
	res, err := s.Ensure(ctxT(t), w)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, res.Path, 12345)
	if err := s.Verify(ctxT(t), digest); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Verify of a corrupt replica: %v", err)
	}
	if _, err := os.Stat(res.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Verify left the corrupt replica: %v", err)
	}
	if err := s.Verify(ctxT(t), digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Verify of nothing: %v", err)
	}

	if _, err := s.Ensure(ctxT(t), w); err != nil {
		t.Fatal(err)
	}
	flipByte(t, res.Path, 999)
	res, err = s.Ensure(ctxT(t), w)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Refetched || res.AlreadyPresent || res.FetchedBytes != int64(len(b)) {
		t.Fatalf("result %+v, want a refetch", res)
	}
	fileEquals(t, res.Path, b)
	if err := s.Verify(ctxT(t), digest); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, at); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0xff
	if _, err := f.WriteAt(one, at); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureResumesCutURLFetch(t *testing.T) {
	b, digest := content(t, 8<<20)
	half := int64(len(b) / 2)
	srv := serveContent(t, b, half)
	s := newStore(t)
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
	ranges := srv.rangeHeaders()
	if len(ranges) != 2 || ranges[0] != "" || !strings.HasPrefix(ranges[1], "bytes=") || ranges[1] == "bytes=0-" {
		t.Fatalf("requests' ranges %q, want a plain GET then a resume", ranges)
	}
	// The resume starts where the disk stopped: at most what the cut
	// response wrote is sent twice.
	if w := srv.written.Load(); w < int64(len(b)) || w > int64(len(b))+half {
		t.Fatalf("server wrote %d bytes for %d", w, len(b))
	}
	if res.FetchedBytes != int64(len(b)) {
		t.Fatalf("fetched %d, want %d", res.FetchedBytes, len(b))
	}
}

func TestEnsureRestartsWhenSourceCannotResume(t *testing.T) {
	b, digest := content(t, 2<<20)
	s := newStore(t)
	// A partial left by a crash; the server answers a Range with 200.
	if err := os.WriteFile(s.partialPath(digest), b[:1<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serveNoRange(t, b)
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
}

func TestEnsureStartsOverWhenResumeDoesNotVerify(t *testing.T) {
	b, digest := content(t, 1<<20)
	s := newStore(t)
	junk, _ := content(t, 1000)
	if err := os.WriteFile(s.partialPath(digest), junk, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serveContent(t, b, 0)
	// The resumed whole does not match; the kept prefix may be at fault,
	// so the fetch starts over once, from 0, within the same Ensure.
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
	if got := srv.rangeHeaders(); len(got) != 2 || got[0] != "bytes=1000-" || got[1] != "" {
		t.Fatalf("requests' ranges %q, want a resume then a fetch from 0", got)
	}
}

func TestEnsureKeepsReplicaWhenAskedSizeIsWrong(t *testing.T) {
	b, digest := content(t, 1000)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	w := Want{Digest: digest, SizeBytes: 1000, Source: NewURLSource(srv.Client(), srv.URL, nil)}
	if _, err := s.Ensure(ctxT(t), w); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: 1000}); err != nil || !res.AlreadyPresent {
		t.Fatalf("ensure without a source of a present replica: %+v %v", res, err)
	}
	_, other := content(t, 1000)
	if _, err := s.Ensure(ctxT(t), Want{Digest: other, SizeBytes: 1000}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ensure without a source of a missing replica: %v", err)
	}
	w.SizeBytes = 999
	if _, err := s.Ensure(ctxT(t), w); !errors.Is(err, ErrSizeMismatch) {
		t.Fatalf("err %v", err)
	}
	if len(s.List()) != 1 {
		t.Fatal("a replica with the right digest was deleted")
	}
}

func TestConcurrentEnsureFetchesOnce(t *testing.T) {
	b, digest := content(t, 4<<20)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	src := &countingSource{Source: NewURLSource(srv.Client(), srv.URL, nil)}
	var wg sync.WaitGroup
	results := make([]Result, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Go(func() {
			results[i], errs[i] = s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: src})
		})
	}
	wg.Wait()
	for i := range 8 {
		if errs[i] != nil || results[i].Path != s.Path(digest) {
			t.Fatalf("ensure %d: %+v %v", i, results[i], errs[i])
		}
	}
	if src.opens.Load() != 1 || srv.requests.Load() != 1 {
		t.Fatalf("%d opens, %d requests; want one fetch", src.opens.Load(), srv.requests.Load())
	}
}

func TestEnsureWaiterCancelDoesNotFailOthers(t *testing.T) {
	b, digest := content(t, 4<<20)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	gate := make(chan struct{})
	src := &gatedSource{Source: NewURLSource(srv.Client(), srv.URL, nil), gate: gate, opened: make(chan struct{})}
	w := Want{Digest: digest, SizeBytes: int64(len(b)), Source: src}
	quitter, quit := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() { _, err := s.Ensure(quitter, w); errc <- err }()
	resc := make(chan error, 1)
	go func() { _, err := s.Ensure(ctxT(t), w); resc <- err }()
	<-src.opened
	quit()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	close(gate)
	if err := <-resc; err != nil {
		t.Fatalf("the other waiter: %v", err)
	}
}

// gatedSource holds its first Open until gate closes.
type gatedSource struct {
	Source
	gate   chan struct{}
	opened chan struct{}
	once   sync.Once
}

func (g *gatedSource) Open(ctx context.Context, off int64) (io.ReadCloser, error) {
	g.once.Do(func() { close(g.opened) })
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Source.Open(ctx, off)
}

func TestRemoveRefusesHeldReplica(t *testing.T) {
	b, digest := content(t, 64<<10)
	srv := serveContent(t, b, 0)
	s := newStore(t)
	if _, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil)}); err != nil {
		t.Fatal(err)
	}
	release := s.Hold(digest)
	if err := s.Remove(digest); !errors.Is(err, ErrInUse) {
		t.Fatalf("Remove of a held replica: %v", err)
	}
	release()
	release() // idempotent
	if err := s.Touch(digest); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(digest); err != nil {
		t.Fatal(err)
	}
	if len(s.List()) != 0 || s.UsedBytes() != 0 {
		t.Fatalf("after remove: %v, %d bytes", s.List(), s.UsedBytes())
	}
	if err := s.Remove(digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	if err := s.Remove("sha256:../../etc"); err == nil {
		t.Fatal("Remove took a digest that is not one")
	}
	if err := os.WriteFile(s.partialPath(digest), b[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	if p := s.Partials(); len(p) != 1 || p[0].Bytes != 100 || s.UsedBytes() != 100 {
		t.Fatalf("partials %v", p)
	}
	if err := s.Remove(digest); err != nil || len(s.Partials()) != 0 {
		t.Fatalf("remove partial: %v %v", err, s.Partials())
	}
}

func TestNewRemovesHalfWrittenSidecars(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(dir); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "meta", "sha256", "abc.json.123"+tmpSuffix)
	if err := os.WriteFile(tmp, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover sidecar: %v", err)
	}
}

func TestEnsureResumesPartialLeftByCrash(t *testing.T) {
	b, digest := content(t, 4<<20)
	dir := t.TempDir()
	crashed, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	kept := int64(3<<20 + 11)
	if err := os.WriteFile(crashed.partialPath(digest), b[:kept], 0o644); err != nil {
		t.Fatal(err)
	}
	// A new process opens the same directory.
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Partials(); len(p) != 1 || p[0].Bytes != kept {
		t.Fatalf("partials %v", p)
	}
	srv := serveContent(t, b, 0)
	var dones []int64
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewURLSource(srv.Client(), srv.URL, nil),
		Progress: func(done, _ int64) { dones = append(dones, done) }})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
	if got := srv.rangeHeaders(); len(got) != 1 || got[0] != "bytes="+strconv.FormatInt(kept, 10)+"-" {
		t.Fatalf("ranges %q", got)
	}
	if srv.written.Load() != int64(len(b))-kept || res.FetchedBytes != int64(len(b))-kept {
		t.Fatalf("server wrote %d, result fetched %d; want only the rest, %d", srv.written.Load(), res.FetchedBytes, int64(len(b))-kept)
	}
	if len(dones) == 0 || dones[len(dones)-1] != int64(len(b)) {
		t.Fatalf("progress %v", dones)
	}
}
