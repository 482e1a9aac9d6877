package bus

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PutObject writes the object store's layout itself (chunks on
// ObjectChunks, then the object's info on ObjectMeta) rather than calling
// ObjectStore.Put, for three reasons: a content-addressed object's name is
// its sha256, known only once every byte has been read; bytes that do not
// match the digest the caller wants must never become an object; and Put
// makes its own publisher (nats.go v1.56) that ignores the caller's
// WithPublishAsyncMaxPending and keeps up to 4,000 chunks (500 MiB) in
// flight, past the server's per-stream ingest queue (128 MiB), so a
// multi-GiB put can be refused 429 "too many requests". Here at most
// objectMaxPending chunks (32 MiB) are in flight.
const (
	// ObjectChunkSize is the size of every chunk PutObject writes but the
	// last (nats.go's default).
	ObjectChunkSize  = 128 * 1024
	objectMaxPending = 256
	// objectStallWait is how long a publish waits for room among the
	// chunks in flight before the upload fails.
	objectStallWait = time.Minute
	// objectDiscardWait bounds the wait for the acks of chunks being
	// discarded, and their purge.
	objectDiscardWait = 30 * time.Second
)

// ObjectPut is one upload into an object store bucket.
type ObjectPut struct {
	Bucket string
	// Name is the object's name; empty names it by its content,
	// sha256/<hex>.
	Name        string
	Description string
	// Want, when set, is the sha256:<hex> the bytes must hash to: bytes
	// that hash to anything else are discarded and an *ObjectDigestError
	// returned.
	Want string
	// Progress, if set, is called with the bytes sent so far.
	Progress func(sent int64)
}

// ObjectStored is what PutObject stored.
type ObjectStored struct {
	Name   string
	Digest string // sha256:<hex>
	Size   int64
	// Reused: the object already held these bytes; nothing new was stored.
	Reused bool
}

// ObjectDigestError is a put whose bytes do not hash to ObjectPut.Want;
// nothing was stored.
type ObjectDigestError struct {
	Size      int64
	Got, Want string
}

func (e *ObjectDigestError) Error() string {
	return fmt.Sprintf("bus: the %d bytes hash to %s, not %s", e.Size, e.Got, e.Want)
}

// PutObject streams r into bucket p.Bucket as one object, hashing as it
// goes, with at most 32 MiB in flight. The object is named (p.Name, or its
// digest) only once every chunk is stored and the digest checked; on any
// failure, and when the object already held the same bytes, the chunks
// sent are purged. An object of the same name and other bytes is replaced,
// its chunks purged, as ObjectStore.Put does.
func PutObject(ctx context.Context, nc *nats.Conn, p ObjectPut, r io.Reader) (ObjectStored, error) {
	up, err := openObjectUpload(ctx, nc, p.Bucket)
	if err != nil {
		return ObjectStored{}, err
	}
	out, err := up.put(ctx, p, r)
	if err != nil || out.Reused {
		up.discard(ctx)
	}
	return out, err
}

// objectUpload is one object's chunks on their way into a bucket.
type objectUpload struct {
	js     jetstream.JetStream
	obs    jetstream.ObjectStore
	stream jetstream.Stream
	bucket string
	nuid   string

	mu     sync.Mutex
	pubErr error // the first chunk the server refused
}

func openObjectUpload(ctx context.Context, nc *nats.Conn, bucket string) (*objectUpload, error) {
	var id [16]byte
	_, _ = rand.Read(id[:])
	up := &objectUpload{bucket: bucket, nuid: hex.EncodeToString(id[:])}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(objectMaxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) { up.fail(err) }))
	if err != nil {
		return nil, err
	}
	up.js = js
	if up.obs, err = js.ObjectStore(ctx, bucket); err != nil {
		return nil, fmt.Errorf("bus: object bucket %s: %w", bucket, err)
	}
	if up.stream, err = js.Stream(ctx, ObjectStream(bucket)); err != nil {
		return nil, fmt.Errorf("bus: object bucket %s: %w", bucket, err)
	}
	return up, nil
}

func (up *objectUpload) fail(err error) {
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.pubErr == nil {
		up.pubErr = err
	}
}

func (up *objectUpload) failed() error {
	up.mu.Lock()
	defer up.mu.Unlock()
	return up.pubErr
}

// put sends the chunks, checks the digest, and names the object.
func (up *objectUpload) put(ctx context.Context, p ObjectPut, r io.Reader) (ObjectStored, error) {
	h := sha256.New()
	size, chunks, err := up.sendChunks(ctx, r, h, p.Progress)
	if err != nil {
		return ObjectStored{}, err
	}
	sum := h.Sum(nil)
	out := ObjectStored{Name: p.Name, Digest: "sha256:" + hex.EncodeToString(sum), Size: size}
	if p.Want != "" && out.Digest != p.Want {
		return ObjectStored{}, &ObjectDigestError{Size: size, Got: out.Digest, Want: p.Want}
	}
	if out.Name == "" {
		out.Name = "sha256/" + hex.EncodeToString(sum)
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: out.Name, Description: p.Description,
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: ObjectChunkSize}},
		Bucket: up.bucket, NUID: up.nuid, Size: uint64(size), Chunks: chunks,
		Digest: "SHA-256=" + base64.URLEncoding.EncodeToString(sum),
	}
	out.Reused, err = up.commit(ctx, info)
	return out, err
}

// sendChunks publishes r's bytes as chunks, at most objectMaxPending in
// flight, hashing them into h, and waits until the server holds them all.
func (up *objectUpload) sendChunks(ctx context.Context, r io.Reader, h hash.Hash, progress func(int64)) (size int64, chunks uint32, err error) {
	subject := ObjectChunks(up.bucket, up.nuid)
	for {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		// A chunk's buffer is its own: an async publish keeps its message
		// to resend it should the server not answer at first.
		buf := make([]byte, ObjectChunkSize)
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			m := nats.NewMsg(subject)
			m.Data = buf[:n]
			if _, err := up.js.PublishMsgAsync(m, jetstream.WithStallWait(objectStallWait)); err != nil {
				return 0, 0, fmt.Errorf("bus: upload chunk %d: %w", chunks, err)
			}
			if err := up.failed(); err != nil {
				return 0, 0, fmt.Errorf("bus: upload chunk %d: %w", chunks, err)
			}
			size += int64(n)
			chunks++
			if progress != nil {
				progress(size)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return 0, 0, fmt.Errorf("bus: upload: read: %w", rerr)
		}
	}
	select {
	case <-up.js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	if err := up.failed(); err != nil {
		return 0, 0, fmt.Errorf("bus: upload: %w", err)
	}
	return size, chunks, nil
}

// commit publishes the object's info, unless an object of that name
// already holds the same bytes (reused: the caller discards the chunks).
// An object of that name with other bytes is replaced and its chunks
// purged.
func (up *objectUpload) commit(ctx context.Context, info jetstream.ObjectInfo) (reused bool, err error) {
	old, err := up.obs.GetInfo(ctx, info.Name, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, fmt.Errorf("bus: object %s: %w", info.Name, err)
	}
	live := old != nil && !old.Deleted
	if live && old.Digest == info.Digest && old.Size == info.Size {
		return true, nil
	}
	b, err := json.Marshal(info)
	if err != nil {
		return false, err
	}
	m := nats.NewMsg(ObjectMeta(up.bucket, info.Name))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = b
	if _, err := up.js.PublishMsg(ctx, m); err != nil {
		return false, fmt.Errorf("bus: store object %s: %w", info.Name, err)
	}
	if live && old.NUID != up.nuid {
		_ = up.stream.Purge(ctx, jetstream.WithPurgeSubject(ObjectChunks(up.bucket, old.NUID)))
	}
	return false, nil
}

// discard drops the chunks sent so far, once their acks are in.
func (up *objectUpload) discard(ctx context.Context) {
	select {
	case <-up.js.PublishAsyncComplete():
	case <-time.After(objectDiscardWait):
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), objectDiscardWait)
	defer cancel()
	_ = up.stream.Purge(pctx, jetstream.WithPurgeSubject(ObjectChunks(up.bucket, up.nuid)))
}
