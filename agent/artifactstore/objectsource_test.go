package artifactstore

import (
	"context"
	"errors"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

func TestEnsureObjectFetchesAndVerifies(t *testing.T) {
	js, obs := startJS(t)
	for _, size := range []int{0, 1, 128 << 10, 3<<20 + 5} {
		b, digest := content(t, size)
		putObject(t, obs, "m", b)
		s := newStore(t)
		res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(size), Source: NewObjectSource(js, bus.ObjectBucketArtifacts, "m", digest)})
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
	src := &countingSource{Source: NewObjectSource(js, bus.ObjectBucketArtifacts, "m", other)}
	_, err := s.Ensure(ctxT(t), Want{Digest: other, SizeBytes: 1 << 20, Source: src})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("err %v", err)
	}
	if src.read.Load() != 0 || src.opens.Load() != 1 || len(s.Partials()) != 0 {
		t.Fatalf("%d bytes read in %d opens, partials %v: the object was refused before a byte", src.read.Load(), src.opens.Load(), s.Partials())
	}

	_, err = s.Ensure(ctxT(t), Want{Digest: other, SizeBytes: 1 << 20, Source: NewObjectSource(js, bus.ObjectBucketArtifacts, "missing", other)})
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
	first := &countingSource{Source: NewObjectSource(js, bus.ObjectBucketArtifacts, "m", digest), cancelAt: 7 << 20, cancel: cancel}
	if _, err := s.Ensure(ctx, Want{Digest: digest, SizeBytes: int64(len(b)), Source: first}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ensure: %v", err)
	}
	second := &countingSource{Source: NewObjectSource(js, bus.ObjectBucketArtifacts, "m", digest)}
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
	src := NewObjectSource(js, bus.ObjectBucketArtifacts, "m", digest)
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
// share the stream; resuming by sequence must either land right or say
// ErrNoResume, never splice wrong bytes.
func TestObjectSourceInterleavedChunks(t *testing.T) {
	js, obs := startJS(t)
	a, da := content(t, 2<<20)
	b, db := content(t, 2<<20)
	errc := make(chan error, 2)
	for _, o := range []struct {
		name string
		b    []byte
	}{{"a", a}, {"b", b}} {
		go func() {
			_, err := obs.PutBytes(context.Background(), o.name, o.b)
			errc <- err
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for name, c := range map[string]struct {
		b      []byte
		digest string
	}{"a": {a, da}, "b": {b, db}} {
		src := NewObjectSource(js, bus.ObjectBucketArtifacts, name, c.digest)
		off := int64(1<<20 + 3)
		rc, err := src.Open(ctxT(t), off)
		if errors.Is(err, ErrNoResume) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := readAllT(rc)
		rc.Close()
		if err != nil || string(got) != string(c.b[off:]) {
			t.Fatalf("%s from %d: %d bytes, %v", name, off, len(got), err)
		}
	}
}
