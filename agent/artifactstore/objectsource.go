package artifactstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	// objectHeartbeat is the pull's idle heartbeat; nats.go fails a pull
	// that misses two in a row, a stalled fetch, which the store resumes.
	objectHeartbeat = 5 * time.Second
	// objectBatch is how many chunks a pull keeps asked for ahead of the
	// reader (4 MiB of 128 KiB chunks).
	objectBatch = 32
)

// ErrSourceSpent: an object source's consumer was read already (a
// consumer's position moves as it is pulled); a resume asks for a new one.
var ErrSourceSpent = errors.New("the object source's consumer was read already; ask for a new one")

// objectSource reads one object of a NATS object store bucket through the
// pull consumer its read names (schemas.ArtifactObjectRead), which the
// control plane created for this fetch: an artifact login may pull that
// consumer and read its info, nothing else (bus.PermsArtifactReader), so
// the object's info comes with the read. nats.go's ObjectStore.Get would
// create a consumer and read the meta record itself, and hash every byte
// again.
type objectSource struct {
	js     jetstream.JetStream
	bucket string
	read   schemas.ArtifactObjectRead
	digest string // sha256:<hex> the object must carry
	opened atomic.Bool
}

// NewObjectSource serves the object read names in bucket, once: Open after
// the first returns ErrSourceSpent. digest (sha256:<hex>) is the content
// expected: an object whose info names another digest is refused with
// ErrDigestMismatch before a byte is fetched.
func NewObjectSource(js jetstream.JetStream, bucket string, read schemas.ArtifactObjectRead, digest string) Source {
	return &objectSource{js: js, bucket: bucket, read: read, digest: digest}
}

// OwnObjectReads is a Source for a caller that may create consumers
// itself (a bench, a test, a bus without auth): each Open creates a fresh
// read of object from the offset asked, as the control plane does for a
// node (bus.CreateObjectRead), and reads it as NewObjectSource does.
func OwnObjectReads(js jetstream.JetStream, bucket, object, digest string) Source {
	return ownObjectReads{js: js, bucket: bucket, object: object, digest: digest}
}

type ownObjectReads struct {
	js                     jetstream.JetStream
	bucket, object, digest string
}

func (o ownObjectReads) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	r, err := bus.CreateObjectRead(ctx, o.js, o.bucket, o.object, offset,
		bus.ObjectReadConfig{Name: "reader_" + rand.Text(), Inactive: time.Minute})
	if errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, bus.ErrObjectLink) {
		return nil, &permanent{fmt.Errorf("object %s in %s: %w", o.object, o.bucket, errors.Join(err, ErrNotFound))}
	}
	if err != nil {
		return nil, err
	}
	return NewObjectSource(o.js, o.bucket, schemas.ArtifactObjectRead(r), o.digest).Open(ctx, offset)
}

// Open reads the consumer from its first chunk (read.StartChunk, at byte
// read.StartByte) and skips what precedes offset. The first delivery's
// pending count must say exactly chunks-StartChunk-1 follow it, which holds
// only if the consumer starts where the control plane's arithmetic said
// (bus.CreateObjectRead); otherwise, as with short or interleaved chunks,
// it is ErrNoResume and the store starts over from byte 0.
func (s *objectSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	where := fmt.Sprintf("object consumer %s in %s", s.read.Consumer, s.bucket)
	if s.opened.Swap(true) {
		return nil, fmt.Errorf("%s: %w", where, ErrSourceSpent)
	}
	want := schemas.ObjectStoreDigest(s.digest)
	switch size := int64(s.read.Size); {
	case want == "" || s.read.Digest != want:
		return nil, fmt.Errorf("%s carries digest %s, not %s: %w", where, s.read.Digest, s.digest, ErrDigestMismatch)
	case offset > size:
		return nil, fmt.Errorf("%s has %d bytes, asked from %d: %w", where, size, offset, ErrNoResume)
	case offset == size || s.read.Chunks == 0:
		return io.NopCloser(eofReader{}), nil
	case offset < s.read.StartByte || s.read.StartChunk >= s.read.Chunks:
		return nil, fmt.Errorf("%s starts at byte %d, asked from %d: %w", where, s.read.StartByte, offset, ErrNoResume)
	}
	cons, err := s.js.Consumer(ctx, bus.ObjectStream(s.bucket), s.read.Consumer)
	if err != nil {
		return nil, s.classifyNATS(where, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(objectBatch), jetstream.PullHeartbeat(objectHeartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return nil, s.classifyNATS(where, err)
	}
	r := &objectReader{it: it, where: where, ctx: ctx, classify: s.classifyNATS,
		chunks: uint64(s.read.Chunks - s.read.StartChunk), remaining: int64(s.read.Size) - s.read.StartByte}
	// The first delivery proves the start before the store appends a byte.
	if err := r.next(); err != nil {
		r.Close()
		return nil, err
	}
	if r.pending+1 != r.chunks {
		r.Close()
		return nil, fmt.Errorf("%s: chunk %d is not where its sequence says: %w", where, s.read.StartChunk, ErrNoResume)
	}
	if err := r.skip(offset - s.read.StartByte); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// objectReader hands out an object's chunks in order.
type objectReader struct {
	it       jetstream.MessagesContext
	where    string
	ctx      context.Context
	classify func(where string, err error) error

	cur       []byte // rest of the current chunk
	delivered uint64 // consumer sequence of the last chunk
	pending   uint64 // chunks after the last one, by the server's count
	chunks    uint64 // chunks this reader expects
	remaining int64  // bytes not yet handed out
	closed    bool
}

func (r *objectReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.delivered > 0 && r.pending == 0 {
			if r.remaining != 0 {
				return 0, fmt.Errorf("%s: chunks ended %d bytes short", r.where, r.remaining)
			}
			return 0, io.EOF
		}
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	r.remaining -= int64(n)
	return n, nil
}

// skip discards n bytes: the part of the object before the offset asked
// that the consumer's first chunk still holds, or (where the chunks did
// not allow a start mid-object) every chunk the store holds already.
func (r *objectReader) skip(n int64) error {
	for n > 0 {
		if len(r.cur) == 0 {
			if r.pending == 0 {
				return fmt.Errorf("%s: chunks ended before the offset: %w", r.where, ErrNoResume)
			}
			if err := r.next(); err != nil {
				return err
			}
		}
		k := min(n, int64(len(r.cur)))
		r.cur, r.remaining, n = r.cur[k:], r.remaining-k, n-k
	}
	return nil
}

// next waits for the next chunk. A pull that hears neither a chunk nor a
// heartbeat for two heartbeats fails (jetstream.ErrNoHeartbeat).
func (r *objectReader) next() error {
	m, err := r.it.Next(jetstream.NextContext(r.ctx))
	if err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			return fmt.Errorf("%s: no chunk for %s: %w", r.where, 2*objectHeartbeat, err)
		}
		return r.classify(r.where, err)
	}
	md, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("%s: chunk without metadata: %w", r.where, err)
	}
	if md.Sequence.Consumer != r.delivered+1 {
		return fmt.Errorf("%s: chunk %d delivered after %d (a gap)", r.where, md.Sequence.Consumer, r.delivered)
	}
	r.delivered, r.pending, r.cur = md.Sequence.Consumer, md.NumPending, m.Data()
	return nil
}

// Close stops pulling. The consumer is the control plane's: the server
// deletes it once nobody has pulled it for a while.
func (r *objectReader) Close() error {
	if !r.closed {
		r.closed = true
		r.it.Stop()
	}
	return nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// classifyNATS maps the NATS errors a fetch can meet to the store's. A
// JetStream API call the login may not make is not answered: the request
// times out and the server's refusal arrives on its own (nc.LastError);
// one that names this bucket's stream is the refusal.
func (s *objectSource) classifyNATS(where string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound), errors.Is(err, jetstream.ErrBucketNotFound),
		errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%s: %v: %w", where, err, ErrNotFound)
	case errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization),
		errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return fmt.Errorf("%s: %v: %w", where, err, ErrSourceAuth)
	}
	if last := s.js.Conn().LastError(); last != nil && errors.Is(last, nats.ErrPermissionViolation) &&
		strings.Contains(last.Error(), bus.ObjectStream(s.bucket)) {
		return fmt.Errorf("%s: %v: %w", where, last, ErrSourceAuth)
	}
	return fmt.Errorf("%s: %w", where, err)
}
