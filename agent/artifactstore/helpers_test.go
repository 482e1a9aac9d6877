package artifactstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// content is random bytes and their digest.
func content(t testing.TB, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

func newStore(t testing.TB, opts ...Option) *Store {
	t.Helper()
	s, err := New(t.TempDir(), append([]Option{WithRetry(3, 10*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startJS starts an embedded nats-server with JetStream and returns a
// connection's JetStream and the artifact bucket.
func startJS(t testing.TB) (jetstream.JetStream, jetstream.ObjectStore) {
	t.Helper()
	e, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir(), Port: -1, MaxPayload: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := nats.Connect(e.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.CreateObjectStore(context.Background(), jetstream.ObjectStoreConfig{Bucket: bus.ObjectBucketArtifacts, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return js, obs
}

// putObject stores b as name. The deadline is the test's: without one,
// nats.go bounds a whole Put by 5 s, which a loaded machine can exceed.
func putObject(t testing.TB, obs jetstream.ObjectStore, name string, b []byte) {
	t.Helper()
	if _, err := obs.Put(ctxT(t), jetstream.ObjectMeta{Name: name}, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

// contentServer serves b over HTTP with Range support, counting requests
// and body bytes written. cut, when > 0, makes the first response stop
// after cut bytes and drop the connection.
type contentServer struct {
	*httptest.Server
	requests atomic.Int64
	written  atomic.Int64
	mu       sync.Mutex
	ranges   []string
}

func serveContent(t testing.TB, b []byte, cut int64) *contentServer {
	t.Helper()
	cs := &contentServer{}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cs.requests.Add(1)
		cs.mu.Lock()
		cs.ranges = append(cs.ranges, r.Header.Get("Range"))
		cs.mu.Unlock()
		cw := &countingWriter{ResponseWriter: w, n: &cs.written}
		if n == 1 && cut > 0 {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.WriteHeader(http.StatusOK)
			_, _ = cw.Write(b[:cut])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // drop the connection mid-body
		}
		http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *contentServer) rangeHeaders() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return append([]string(nil), cs.ranges...)
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}

// countingSource counts Opens and bytes read through a real source, and
// can cancel a context once a number of bytes went through.
type countingSource struct {
	Source
	opens    atomic.Int64
	read     atomic.Int64
	offsets  []int64
	mu       sync.Mutex
	cancelAt int64
	cancel   context.CancelFunc
}

func (c *countingSource) Open(ctx context.Context, off int64) (io.ReadCloser, error) {
	c.opens.Add(1)
	c.mu.Lock()
	c.offsets = append(c.offsets, off)
	c.mu.Unlock()
	rc, err := c.Source.Open(ctx, off)
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: rc, c: c}, nil
}

type countingReader struct {
	io.ReadCloser
	c *countingSource
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if total := r.c.read.Add(int64(n)); r.c.cancel != nil && r.c.cancelAt > 0 && total >= r.c.cancelAt {
		r.c.cancel()
	}
	return n, err
}

func fileEquals(t testing.TB, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d expected", path, len(got), len(want))
	}
}

// serveNoRange serves b with 200 to every request, Range or not.
func serveNoRange(t testing.TB, b []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func readAllT(r io.Reader) ([]byte, error) { return io.ReadAll(r) }
