package bus_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestObjectSubjects: the layout's names, and that they are the subjects
// nats.go's own ObjectStore writes an object to.
func TestObjectSubjects(t *testing.T) {
	if got := bus.ObjectStream("wf_x"); got != "OBJ_wf_x" {
		t.Fatalf("ObjectStream = %q", got)
	}
	if got := bus.ObjectChunks("wf_x", "N1"); got != "$O.wf_x.C.N1" {
		t.Fatalf("ObjectChunks = %q", got)
	}
	if got, want := bus.ObjectMeta("wf_x", "sha256/ab"), "$O.wf_x.M."+base64.URLEncoding.EncodeToString([]byte("sha256/ab")); got != want {
		t.Fatalf("ObjectMeta = %q, want %q", got, want)
	}

	ctx, obs, stream := objectBucket(t)
	info, err := obs.PutBytes(ctx, "dir/name", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{bus.ObjectMeta(obs.bucket, "dir/name"), bus.ObjectChunks(obs.bucket, info.NUID)} {
		if _, err := stream.GetLastMsgForSubject(ctx, subj); err != nil {
			t.Fatalf("nats.go's Put wrote nothing on %s: %v", subj, err)
		}
	}
}

// TestPutObject_LargerThanWindow: an object bigger than the 32 MiB in
// flight round-trips byte-exact through nats.go's Get (which checks the
// digest), named by its content, with the object store's SHA-256.
func TestPutObject_LargerThanWindow(t *testing.T) {
	ctx, obs, _ := objectBucket(t)
	data := randomBytes(1, 33<<20+5)
	sum := sha256.Sum256(data)
	var progress int64
	st, err := bus.PutObject(ctx, obs.Conn(t), bus.ObjectPut{Bucket: obs.bucket, Progress: func(n int64) { progress = n }}, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if st.Name != "sha256/"+hex.EncodeToString(sum[:]) || st.Digest != digest || st.Size != int64(len(data)) || st.Reused || progress != st.Size {
		t.Fatalf("stored %+v, progress %d", st, progress)
	}
	info, err := obs.GetInfo(ctx, st.Name)
	if err != nil {
		t.Fatal(err)
	}
	chunks := (len(data) + bus.ObjectChunkSize - 1) / bus.ObjectChunkSize
	if info.Digest != "SHA-256="+base64.URLEncoding.EncodeToString(sum[:]) || info.Size != uint64(len(data)) || int(info.Chunks) != chunks {
		t.Fatalf("info %+v: want %d bytes in %d chunks", info, len(data), chunks)
	}
	r, err := obs.Get(ctx, st.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, not the %d put", len(got), len(data))
	}
}

// TestPutObject_Refusals: bytes that miss the wanted digest leave nothing
// behind; the same bytes again are reused, storing nothing; other bytes
// under the same name replace the object and drop its old chunks.
func TestPutObject_Refusals(t *testing.T) {
	ctx, obs, stream := objectBucket(t)
	nc := obs.Conn(t)
	a, b := randomBytes(2, 300<<10), randomBytes(3, 200<<10)
	sumB := sha256.Sum256(b)

	_, err := bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: obs.bucket, Name: "w", Want: "sha256:" + hex.EncodeToString(sumB[:])}, bytes.NewReader(a))
	var mismatch *bus.ObjectDigestError
	if !errors.As(err, &mismatch) || mismatch.Size != int64(len(a)) {
		t.Fatalf("a put missing its digest: %v", err)
	}
	if n := msgs(t, stream); n != 0 {
		t.Fatalf("a refused put left %d messages", n)
	}

	if _, err := bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: obs.bucket, Name: "w"}, bytes.NewReader(a)); err != nil {
		t.Fatal(err)
	}
	before := msgs(t, stream) // 3 chunks and the info
	st, err := bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: obs.bucket, Name: "w"}, bytes.NewReader(a))
	if err != nil || !st.Reused || msgs(t, stream) != before {
		t.Fatalf("the same bytes again: %+v, %v; %d messages, had %d", st, err, msgs(t, stream), before)
	}

	st, err = bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: obs.bucket, Name: "w"}, bytes.NewReader(b))
	if err != nil || st.Reused {
		t.Fatalf("other bytes under the name: %+v, %v", st, err)
	}
	if n := msgs(t, stream); n != 2+1 {
		t.Fatalf("after the replacement the stream holds %d messages, want its 2 chunks and the info", n)
	}
	got, err := obs.GetBytes(ctx, "w")
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
}

// testBucket is an object store bucket on a fresh embedded NATS.
type testBucket struct {
	jetstream.ObjectStore
	bucket, url string
}

// Conn is a connection of the test's own to the bucket's server.
func (b testBucket) Conn(t *testing.T) *nats.Conn {
	return testenv.Dial(t, b.url, "put").NC
}

func objectBucket(t *testing.T) (context.Context, testBucket, jetstream.Stream) {
	t.Helper()
	n := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn := testenv.Dial(t, n.URL(), "test")
	obs, err := conn.JS.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "test_objects"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := conn.JS.Stream(ctx, bus.ObjectStream("test_objects"))
	if err != nil {
		t.Fatal(err)
	}
	return ctx, testBucket{ObjectStore: obs, bucket: "test_objects", url: n.URL()}, stream
}

func msgs(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func randomBytes(seed byte, n int) []byte {
	var key [32]byte
	key[0] = seed
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}
