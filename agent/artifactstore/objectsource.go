package artifactstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	// objectHeartbeat is the consumer's idle heartbeat; a delivery silent
	// for objectStall is a stalled fetch, failed and resumed.
	objectHeartbeat = 5 * time.Second
	objectStall     = 3 * objectHeartbeat
	// objectInactive lets the server delete the consumer of a fetch whose
	// process died.
	objectInactive = 30 * time.Second
)

// objectSource reads one object of a NATS object store bucket.
//
// It reads the object's chunks itself, through a push consumer delivered
// to the connection's inbox (the API calls: STREAM.INFO and DIRECT.GET for
// the object's info and its last chunk, CONSUMER.CREATE and
// CONSUMER.DELETE; flow-control replies go to the subjects the server
// names, which allow_responses covers). nats.go's ObjectStore.Get would
// hash every byte again and cannot start mid-object.
type objectSource struct {
	js     jetstream.JetStream
	bucket string
	object string
	digest string // sha256:<hex> the object must carry
}

// NewObjectSource serves object from bucket; digest (sha256:<hex>) is the
// content expected: an object whose info names another digest is refused
// with ErrDigestMismatch before a byte is fetched.
func NewObjectSource(js jetstream.JetStream, bucket, object, digest string) Source {
	return &objectSource{js: js, bucket: bucket, object: object, digest: digest}
}

// Open starts at offset by arithmetic, each step checked: the object's
// chunks are the messages on bus.ObjectChunks(bucket, nuid). Byte offset is
// chunk k = offset/ChunkSize if every chunk but the last is full, which
// holds iff (chunks-1)*ChunkSize + len(last chunk) == size. If the chunks
// are also contiguous in the stream, chunk k is at last-chunk-sequence -
// (chunks-1) + k; the consumer starts there, and the first delivery's
// pending count must say exactly chunks-k-1 follow it, which holds only if
// exactly k chunks precede the start. Any check that fails (short or
// interleaved chunks) is ErrNoResume, and the store starts over from byte 0.
func (s *objectSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	where := fmt.Sprintf("object %s in %s", s.object, s.bucket)
	info, err := s.info(ctx, where, offset)
	if err != nil {
		return nil, err
	}
	if offset == int64(info.Size) || info.Chunks == 0 {
		return io.NopCloser(eofReader{}), nil
	}
	chunk := int64(bus.ObjectChunkSize)
	if info.Opts != nil && info.Opts.ChunkSize > 0 {
		chunk = int64(info.Opts.ChunkSize)
	}
	k, skip := offset/chunk, offset%chunk
	if k >= int64(info.Chunks) {
		return nil, fmt.Errorf("%s: offset %d past its %d chunks: %w", where, offset, info.Chunks, ErrNoResume)
	}
	start, err := s.chunkSequence(ctx, where, info, k, chunk)
	if err != nil {
		return nil, err
	}
	r, err := s.deliver(ctx, where, info, start)
	if err != nil {
		return nil, err
	}
	r.remaining, r.chunks = int64(info.Size)-k*chunk, uint64(int64(info.Chunks)-k)
	// The first delivery proves the start (see above) before the store
	// appends a byte.
	if err := r.next(); err != nil {
		r.Close()
		return nil, err
	}
	if r.pending+1 != r.chunks {
		r.Close()
		return nil, fmt.Errorf("%s: chunk %d is not where its sequence says: %w", where, k, ErrNoResume)
	}
	if int64(len(r.cur)) < skip {
		r.Close()
		return nil, fmt.Errorf("%s: chunk %d is shorter than its chunk size: %w", where, k, ErrNoResume)
	}
	r.cur = r.cur[skip:]
	r.remaining -= skip
	return r, nil
}

// info is the object's info, checked: a content object carrying the
// digest asked for, at least offset bytes long.
func (s *objectSource) info(ctx context.Context, where string, offset int64) (*jetstream.ObjectInfo, error) {
	obs, err := s.js.ObjectStore(ctx, s.bucket)
	if err != nil {
		return nil, s.classifyNATS(where, err)
	}
	info, err := obs.GetInfo(ctx, s.object)
	if err != nil {
		return nil, s.classifyNATS(where, err)
	}
	want := schemas.ObjectStoreDigest(s.digest)
	switch {
	case info.Opts != nil && info.Opts.Link != nil:
		return nil, &permanent{fmt.Errorf("%s is a link; the catalog names content objects", where)}
	case want == "" || info.Digest != want:
		return nil, fmt.Errorf("%s carries digest %s, not %s: %w", where, info.Digest, s.digest, ErrDigestMismatch)
	case offset > int64(info.Size):
		return nil, fmt.Errorf("%s has %d bytes, asked from %d: %w", where, info.Size, offset, ErrNoResume)
	}
	return info, nil
}

// chunkSequence is the stream sequence of chunk k (of chunk bytes each but
// the last), 0 for the first chunk (the consumer then starts at the
// subject's first message). It fails with ErrNoResume where the chunks'
// sizes do not add up.
func (s *objectSource) chunkSequence(ctx context.Context, where string, info *jetstream.ObjectInfo, k, chunk int64) (uint64, error) {
	if k == 0 {
		return 0, nil
	}
	str, err := s.js.Stream(ctx, bus.ObjectStream(s.bucket))
	if err != nil {
		return 0, s.classifyNATS(where, err)
	}
	last, err := str.GetLastMsgForSubject(ctx, bus.ObjectChunks(s.bucket, info.NUID))
	if err != nil {
		return 0, s.classifyNATS(where, err)
	}
	// nats.go's Put makes a chunk of each Read, so a chunk may be short.
	// If the sizes add up with every chunk but the last full, every chunk
	// but the last is full, and chunk k starts at k*chunk.
	if int64(info.Chunks-1)*chunk+int64(len(last.Data)) != int64(info.Size) {
		return 0, fmt.Errorf("%s: chunks are not of its chunk size: %w", where, ErrNoResume)
	}
	start := int64(last.Sequence) - int64(info.Chunks-1) + k
	if start < 1 {
		return 0, fmt.Errorf("%s: chunks are not contiguous: %w", where, ErrNoResume)
	}
	return uint64(start), nil
}

// deliver starts a push consumer of the object's chunks from stream
// sequence start (0: the first chunk), delivered to a fresh inbox, and
// returns the reader of its deliveries.
func (s *objectSource) deliver(ctx context.Context, where string, info *jetstream.ObjectInfo, start uint64) (*objectReader, error) {
	stream := bus.ObjectStream(s.bucket)
	nc := s.js.Conn()
	cfg := jetstream.ConsumerConfig{
		Name:              "wf_artifact_" + rand.Text(),
		DeliverSubject:    nc.NewInbox(),
		FilterSubject:     bus.ObjectChunks(s.bucket, info.NUID),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FlowControl:       true,
		IdleHeartbeat:     objectHeartbeat,
		InactiveThreshold: objectInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if start > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	sub, err := nc.SubscribeSync(cfg.DeliverSubject)
	if err != nil {
		return nil, fmt.Errorf("%s: subscribe: %w", where, err)
	}
	if _, err := s.js.CreatePushConsumer(ctx, stream, cfg); err != nil {
		_ = sub.Unsubscribe()
		return nil, s.classifyNATS(where, err)
	}
	return &objectReader{nc: nc, sub: sub, js: s.js, stream: stream, consumer: cfg.Name, where: where, ctx: ctx}, nil
}

// objectReader hands out an object's chunks in order.
type objectReader struct {
	nc       *nats.Conn
	sub      *nats.Subscription
	js       jetstream.JetStream
	stream   string
	consumer string
	where    string
	ctx      context.Context

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

// next waits for the next chunk, answering flow control on the way. The
// stall deadline counts from the call, not from the last heartbeat: a
// consumer stalled on flow control keeps sending heartbeats.
func (r *objectReader) next() error {
	ctx, cancel := context.WithTimeout(r.ctx, objectStall)
	defer cancel()
	for {
		m, err := r.sub.NextMsgWithContext(ctx)
		if err != nil {
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s: no chunk for %s (a login that cannot answer flow control stalls: it needs allow_responses)", r.where, objectStall)
			}
			return fmt.Errorf("%s: %w", r.where, err)
		}
		if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
			switch {
			case status == "100" && m.Reply != "":
				_ = m.Respond(nil) // flow control request
			case status == "100":
				if fc := m.Header.Get("Nats-Consumer-Stalled"); fc != "" {
					_ = r.nc.Publish(fc, nil)
				}
			default:
				return fmt.Errorf("%s: consumer status %s %s", r.where, status, m.Header.Get("Description"))
			}
			continue
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("%s: chunk without metadata: %w", r.where, err)
		}
		if md.Sequence.Consumer != r.delivered+1 {
			return fmt.Errorf("%s: chunk %d delivered after %d (a gap)", r.where, md.Sequence.Consumer, r.delivered)
		}
		r.delivered, r.pending, r.cur = md.Sequence.Consumer, md.NumPending, m.Data
		return nil
	}
}

// Close stops the delivery and deletes the consumer (the server would
// after objectInactive anyway).
func (r *objectReader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	_ = r.sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 2*time.Second)
	defer cancel()
	_ = r.js.DeleteConsumer(ctx, r.stream, r.consumer)
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
