package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// The upload writes the object store's own layout (chunks on
// $O.<bucket>.C.<nuid>, then the object's info on $O.<bucket>.M.<name>)
// rather than calling ObjectStore.Put, for three reasons: the object's
// name is its sha256, known only once every byte has been read; bytes
// that do not match --digest must never become an object; and Put makes
// its own publisher (nats.go v1.56) that ignores the caller's
// WithPublishAsyncMaxPending and keeps up to 4,000 chunks (500 MiB) in
// flight, past the server's per-stream ingest queue (128 MiB), so a
// multi-GiB put can be refused 429 "too many requests". Here at most
// uploadMaxPending chunks (32 MiB) are in flight.
const (
	uploadChunkSize  = 128 * 1024
	uploadMaxPending = 256
	// uploadStallWait is how long a publish waits for room among the
	// chunks in flight before the upload fails.
	uploadStallWait = time.Minute
)

// uploaded is what an upload stored.
type uploaded struct {
	Object string
	Digest string
	Size   int64
	// Reused: the object already held these bytes; nothing new was stored.
	Reused bool
}

// errDigestMismatch is a put whose bytes do not hash to --digest.
var errDigestMismatch = errors.New("the file does not match --digest")

// uploadArtifact streams r into the artifact bucket as object
// sha256/<hex>, hashing as it goes. With want set, bytes that hash to
// another digest are discarded and errDigestMismatch returned (wrapped
// with a refusal). progress, if set, is called with the bytes sent so far.
func uploadArtifact(ctx context.Context, nc *nats.Conn, r io.Reader, want string, progress func(done int64)) (uploaded, error) {
	var (
		mu     sync.Mutex
		pubErr error
	)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(uploadMaxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			defer mu.Unlock()
			if pubErr == nil {
				pubErr = err
			}
		}))
	if err != nil {
		return uploaded{}, err
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return pubErr
	}
	bucket := bus.ObjectBucketArtifacts
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return uploaded{}, fmt.Errorf("artifact bucket %s: %w (is the control plane provisioned? `warmfleet serve` makes it)", bucket, err)
	}
	stream, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return uploaded{}, fmt.Errorf("artifact bucket %s: %w", bucket, err)
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	nuid := hex.EncodeToString(id[:])
	chunkSubj := "$O." + bucket + ".C." + nuid
	// discard drops the chunks sent so far, once their acks are in.
	discard := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = stream.Purge(pctx, jetstream.WithPurgeSubject(chunkSubj))
	}

	h := sha256.New()
	var size int64
	var chunks uint32
	for {
		if err := ctx.Err(); err != nil {
			discard()
			return uploaded{}, err
		}
		// A chunk's buffer is its own: an async publish keeps its message
		// to resend it should the server not answer at first.
		buf := make([]byte, uploadChunkSize)
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			m := nats.NewMsg(chunkSubj)
			m.Data = buf[:n]
			if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(uploadStallWait)); err != nil {
				discard()
				return uploaded{}, fmt.Errorf("upload chunk %d: %w", chunks, err)
			}
			if err := failed(); err != nil {
				discard()
				return uploaded{}, fmt.Errorf("upload chunk %d: %w", chunks, err)
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
			discard()
			return uploaded{}, fmt.Errorf("read: %w", rerr)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		discard()
		return uploaded{}, ctx.Err()
	}
	if err := failed(); err != nil {
		discard()
		return uploaded{}, fmt.Errorf("upload: %w", err)
	}
	sum := h.Sum(nil)
	got := "sha256:" + hex.EncodeToString(sum)
	if want != "" && got != want {
		discard()
		return uploaded{}, fmt.Errorf("%w: %w", errDigestMismatch, &schemas.Refusal{Code: schemas.CodeArtifactDigestMismatch, Field: "--digest",
			Reason: fmt.Sprintf("the file's %d bytes hash to %s, not %s; nothing was stored: check the file, or drop --digest", size, got, want)})
	}
	out := uploaded{Object: "sha256/" + hex.EncodeToString(sum), Digest: got, Size: size}

	old, err := obs.GetInfo(ctx, out.Object, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		discard()
		return uploaded{}, err
	}
	if old != nil && !old.Deleted && old.Digest == schemas.ObjectStoreDigest(got) && old.Size == uint64(size) {
		discard() // the same bytes are already there
		out.Reused = true
		return out, nil
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: out.Object, Description: "warmfleet artifact content",
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: uploadChunkSize}},
		Bucket: bucket, NUID: nuid, Size: uint64(size), Chunks: chunks,
		Digest: "SHA-256=" + base64.URLEncoding.EncodeToString(sum),
	}
	b, err := json.Marshal(info)
	if err != nil {
		discard()
		return uploaded{}, err
	}
	mm := nats.NewMsg("$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(out.Object)))
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	mm.Data = b
	if _, err := js.PublishMsg(ctx, mm); err != nil {
		discard()
		return uploaded{}, fmt.Errorf("store object %s: %w", out.Object, err)
	}
	if old != nil && !old.Deleted && old.NUID != nuid {
		// Replaced a damaged object of the same name: drop its chunks.
		_ = stream.Purge(ctx, jetstream.WithPurgeSubject("$O."+bucket+".C."+old.NUID))
	}
	return out, nil
}
