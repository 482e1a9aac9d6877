package artifactstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestEnsureObjectFetchesAndVerifies(t *testing.T) {
	js, obs := startJS(t)
	for _, size := range []int{0, 1, 128 << 10, 3<<20 + 5} {
		b, digest := content(t, size)
		putObject(t, obs, "m", b)
		s := newStore(t)
		res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(size), Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest)})
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if res.FetchedBytes != int64(size) {
			t.Fatalf("%d bytes: fetched %d", size, res.FetchedBytes)
		}
		fileEquals(t, res.Path, b)
	}
}

func TestObjectSourceRefusesOtherDigest(t *testing.T) {
	js, obs := startJS(t)
	b, _ := content(t, 1<<20)
	putObject(t, obs, "m", b)
	_, other := content(t, 1<<20)
	s := newStore(t)
	src := &countingSource{Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", other)}
	_, err := s.Ensure(ctxT(t), Want{Digest: other, SizeBytes: 1 << 20, Source: src})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("err %v", err)
	}
	if src.read.Load() != 0 || src.opens.Load() != 1 || len(s.Partials()) != 0 {
		t.Fatalf("%d bytes read in %d opens, partials %v: the object was refused before a byte", src.read.Load(), src.opens.Load(), s.Partials())
	}

	_, err = s.Ensure(ctxT(t), Want{Digest: other, SizeBytes: 1 << 20, Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "missing", other)})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
}

func TestEnsureResumesCancelledObjectFetch(t *testing.T) {
	js, obs := startJS(t)
	// Another object first, so the chunks start past sequence 1.
	pre, _ := content(t, 300<<10)
	putObject(t, obs, "other", pre)
	b, digest := content(t, 16<<20+3)
	putObject(t, obs, "m", b)
	s := newStore(t)

	ctx, cancel := context.WithCancel(ctxT(t))
	first := &countingSource{Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest), cancelAt: 7 << 20, cancel: cancel}
	if _, err := s.Ensure(ctx, Want{Digest: digest, SizeBytes: int64(len(b)), Source: first}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ensure: %v", err)
	}
	second := &countingSource{Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest)}
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: second})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
	if len(second.offsets) != 1 || second.offsets[0] == 0 {
		t.Fatalf("second fetch opened at %v, want one resume", second.offsets)
	}
	if got := second.read.Load(); got != int64(len(b))-second.offsets[0] || got >= int64(len(b)) {
		t.Fatalf("second fetch read %d bytes from offset %d of %d", got, second.offsets[0], len(b))
	}
	if res.FetchedBytes != second.read.Load() {
		t.Fatalf("result says %d fetched, source served %d", res.FetchedBytes, second.read.Load())
	}
}

func TestObjectSourceResumesAtAnyOffset(t *testing.T) {
	js, obs := startJS(t)
	b, digest := content(t, 1<<20+100)
	putObject(t, obs, "m", b)
	src := OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest)
	for _, off := range []int64{1, 128 << 10, 128<<10 + 7, 1 << 20, 1<<20 + 99, 1<<20 + 100} {
		rc, err := src.Open(ctxT(t), off)
		if err != nil {
			t.Fatalf("open at %d: %v", off, err)
		}
		got, err := readAllT(rc)
		rc.Close()
		if err != nil || string(got) != string(b[off:]) {
			t.Fatalf("from %d: %d bytes, %v", off, len(got), err)
		}
	}
	if _, err := src.Open(ctxT(t), int64(len(b))+1); !errors.Is(err, ErrNoResume) {
		t.Fatalf("past the end: %v", err)
	}
}

// TestObjectSourceInterleavedChunks: chunks of two objects written at once
// share the stream, so sequence arithmetic lands on the wrong chunk; the
// source must notice (ErrNoResume) and the store start over, never splice
// wrong bytes.
func TestObjectSourceInterleavedChunks(t *testing.T) {
	js, obs := startJS(t)
	a, da := content(t, 2<<20)
	b, _ := content(t, 1<<20)
	// a's first MiB, then all of b, then the rest of a.
	gate := make(chan struct{})
	errc := make(chan error, 1)
	ctx := ctxT(t)
	go func() {
		_, err := obs.Put(ctx, jetstream.ObjectMeta{Name: "a"}, io.MultiReader(bytes.NewReader(a[:1<<20]), &waitReader{gate: gate, r: bytes.NewReader(a[1<<20:])}))
		errc <- err
	}()
	waitChunks(t, js, 8)
	putObject(t, obs, "b", b)
	close(gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	src := OwnObjectReads(js, bus.ObjectBucketArtifacts, "a", da)
	// Chunk 3 lies before b's chunks: the arithmetic from the last chunk
	// misses it, and the first delivery's pending count says so.
	if _, err := src.Open(ctxT(t), 3<<17); !errors.Is(err, ErrNoResume) {
		t.Fatalf("open at chunk 3 of interleaved chunks: %v, want ErrNoResume", err)
	}
	// Chunk 12 lies after them: the arithmetic holds, and the count agrees.
	rc, err := src.Open(ctxT(t), 12<<17+5)
	if err != nil {
		t.Fatalf("open at chunk 12: %v", err)
	}
	got, err := readAllT(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, a[12<<17+5:]) {
		t.Fatalf("from chunk 12: %d bytes, %v", len(got), err)
	}

	s := newStore(t)
	if err := os.WriteFile(s.partialPath(da), a[:3<<17], 0o644); err != nil {
		t.Fatal(err)
	}
	counted := &countingSource{Source: src}
	res, err := s.Ensure(ctxT(t), Want{Digest: da, SizeBytes: int64(len(a)), Source: counted})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, a)
	if got := counted.offsets; len(got) != 2 || got[0] != 3<<17 || got[1] != 0 {
		t.Fatalf("opens at %v, want a refused resume then a start from 0", got)
	}
}

// waitReader blocks until gate closes, then reads r.
type waitReader struct {
	gate chan struct{}
	r    io.Reader
}

func (w *waitReader) Read(p []byte) (int, error) {
	<-w.gate
	return w.r.Read(p)
}

// waitChunks waits until the artifact stream holds n messages.
func waitChunks(t *testing.T, js jetstream.JetStream, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		str, err := js.Stream(ctxT(t), "OBJ_"+bus.ObjectBucketArtifacts)
		if err == nil && str.CachedInfo().State.Msgs >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the stream never held %d chunks", n)
}

// TestObjectSourceShortChunks: an object put from a reader that returns
// short reads has short chunks; byte offsets are not chunk multiples, so
// the read starts at the first chunk and the source skips the bytes before
// the offset rather than splice at a guessed chunk.
func TestObjectSourceShortChunks(t *testing.T) {
	js, obs := startJS(t)
	b, digest := content(t, 2<<20)
	if _, err := obs.Put(ctxT(t), jetstream.ObjectMeta{Name: "m"}, iotest.HalfReader(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	src := OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest)
	for _, off := range []int64{100, 3 << 17} {
		rc, err := src.Open(ctxT(t), off)
		if err != nil {
			t.Fatalf("open at %d: %v", off, err)
		}
		got, err := readAllT(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, b[off:]) {
			t.Fatalf("from %d: %d bytes, %v", off, len(got), err)
		}
	}
	s := newStore(t)
	if err := os.WriteFile(s.partialPath(digest), b[:3<<17], 0o644); err != nil {
		t.Fatal(err)
	}
	counted := &countingSource{Source: src}
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: counted})
	if err != nil {
		t.Fatal(err)
	}
	fileEquals(t, res.Path, b)
	if len(counted.offsets) != 1 || counted.offsets[0] != 3<<17 || counted.read.Load() != int64(len(b)-3<<17) {
		t.Fatalf("opens at %v handed out %d bytes, want one resume of the rest", counted.offsets, counted.read.Load())
	}
}

// TestObjectSourceReadsOnce: a read's consumer moves as it is pulled, so
// a second Open of one source is ErrSourceSpent, never bytes from
// wherever the consumer stands.
func TestObjectSourceReadsOnce(t *testing.T) {
	js, obs := startJS(t)
	b, digest := content(t, 300<<10)
	putObject(t, obs, "m", b)
	r, err := bus.CreateObjectRead(ctxT(t), js, bus.ObjectBucketArtifacts, "m", 0, bus.ObjectReadConfig{Name: "once", Inactive: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	src := NewObjectSource(js, bus.ObjectBucketArtifacts, schemas.ArtifactObjectRead{Consumer: r.Consumer, Digest: r.Digest, Size: r.Size, Chunks: r.Chunks}, digest)
	rc, err := src.Open(ctxT(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAllT(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if _, err := src.Open(ctxT(t), 0); !errors.Is(err, ErrSourceSpent) {
		t.Fatalf("second open: %v, want ErrSourceSpent", err)
	}
}
