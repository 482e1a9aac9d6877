package checkpoint

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// ObjectStore keeps one session's checkpoints in a NATS object store
// bucket: chunks as <tenant>/<session>/c/<digest>, manifests as
// <tenant>/<session>/m/<sequence, 20 digits>. Chunks are not shared
// between sessions, so one session's content reveals nothing of another's
// and pruning one never touches another.
//
// A chunk that fits in one NATS message is stored as a one-message object,
// and read back with two direct gets (its info, then its message) instead
// of ObjectStore.Get, which creates a consumer for every object: for a
// restore of many 1 MiB chunks that was most of its time.
type ObjectStore struct {
	*ObjectBucket
	prefix string
}

// ObjectBucket is a checkpoint bucket, opened once for every session's
// store in it.
type ObjectBucket struct {
	obs    jetstream.ObjectStore
	stream jetstream.Stream
	bucket string
	// maxMessage is the largest message the connection may publish.
	maxMessage int64
}

var _ PruneStore = (*ObjectStore)(nil)

// OpenObjectBucket opens bucket, which must exist.
func OpenObjectBucket(ctx context.Context, js jetstream.JetStream, bucket string) (*ObjectBucket, error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: bucket %s: %w", bucket, err)
	}
	stream, err := js.Stream(ctx, bus.ObjectStream(bucket))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: bucket %s: %w", bucket, err)
	}
	return &ObjectBucket{obs: obs, stream: stream, bucket: bucket, maxMessage: js.Conn().MaxPayload()}, nil
}

// Session is the store of session tenant/session in the bucket.
func (b *ObjectBucket) Session(tenant, session string) (*ObjectStore, error) {
	for _, part := range []string{tenant, session} {
		if part == "" || strings.ContainsAny(part, "/.*> \t\n") {
			return nil, fmt.Errorf("checkpoint: store name %q: a tenant or session id, not empty, no '/', '.', '*', '>' or space", part)
		}
	}
	return &ObjectStore{ObjectBucket: b, prefix: tenant + "/" + session + "/"}, nil
}

func (s *ObjectStore) chunk(d string) string { return s.prefix + "c/" + d }
func (s *ObjectStore) manifest(id ID) string {
	return fmt.Sprintf("%sm/%020d.%020d", s.prefix, id.Sequence, id.Epoch)
}

// encodingHeader marks a compressed chunk's object.
const encodingHeader = "Wf-Encoding"

// HasChunk implements Store.
func (s *ObjectStore) HasChunk(ctx context.Context, digest string) (bool, error) {
	_, err := s.obs.GetInfo(ctx, s.chunk(digest))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, nil
	}
	return err == nil, err
}

// PutChunk implements Store.
func (s *ObjectStore) PutChunk(ctx context.Context, digest string, c Chunk) error {
	meta := jetstream.ObjectMeta{Name: s.chunk(digest)}
	if n := int64(len(c.Data)); n > 0 {
		meta.Opts = &jetstream.ObjectMetaOptions{ChunkSize: uint32(min(n, s.maxMessage))}
	}
	if c.Compressed {
		meta.Headers = nats.Header{encodingHeader: []string{"zstd"}}
	}
	_, err := s.obs.Put(ctx, meta, bytes.NewReader(c.Data))
	return err
}

// GetChunk implements Store. A chunk read through ObjectStore.Get comes
// Verified when raw: nats.go checks the bytes against the object's
// SHA-256, which must be the chunk's digest. One read as a single message
// is checked by Restore.
func (s *ObjectStore) GetChunk(ctx context.Context, digest string) (Chunk, error) {
	name := s.chunk(digest)
	info, err := s.obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Chunk{}, refuse(CodeIncomplete, name, "not in the store")
	}
	if err != nil {
		return Chunk{}, err
	}
	c := Chunk{Compressed: info.Headers.Get(encodingHeader) == "zstd"}
	if info.Chunks == 1 {
		msg, err := s.stream.GetLastMsgForSubject(ctx, bus.ObjectChunks(s.bucket, info.NUID))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Chunk{}, refuse(CodeIncomplete, name, "its content is not in the store")
		}
		if err != nil {
			return Chunk{}, err
		}
		c.Data = msg.Data
		return c, nil
	}
	if c.Data, _, err = s.get(ctx, name, MaxChunkSize); err != nil {
		return Chunk{}, err
	}
	c.Verified = !c.Compressed && info.Digest == schemas.ObjectStoreDigest("sha256:"+digest)
	return c, nil
}

// PutManifest implements Store.
func (s *ObjectStore) PutManifest(ctx context.Context, id ID, data []byte) error {
	_, err := s.obs.PutBytes(ctx, s.manifest(id), data)
	return err
}

// GetManifest implements Store.
func (s *ObjectStore) GetManifest(ctx context.Context, id ID) ([]byte, error) {
	b, _, err := s.get(ctx, s.manifest(id), MaxManifestBytes)
	return b, err
}

// getTimeout bounds one object read.
const getTimeout = time.Minute

// get reads one object whole. The read is not cancelled with ctx: nats.go
// stops delivering an object's chunks once its context is cancelled but
// leaves its reader waiting for them until the deadline, so a read is let
// finish (an object is at most MaxChunkSize) and ctx is checked after.
func (s *ObjectStore) get(ctx context.Context, name string, limit int64) ([]byte, *jetstream.ObjectInfo, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), getTimeout)
	defer cancel()
	b, info, err := s.read(rctx, name, limit)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return nil, nil, ctxErr
	}
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, nil, refuse(CodeIncomplete, name, "not in the store")
	case errors.Is(err, jetstream.ErrDigestMismatch):
		return nil, nil, refuse(CodeCorrupt, name, "the object store's digest does not match its content")
	}
	return b, info, err
}

// read reads one object of at most limit bytes into a buffer of its size,
// then to its end, where nats.go checks its digest.
func (s *ObjectStore) read(ctx context.Context, name string, limit int64) ([]byte, *jetstream.ObjectInfo, error) {
	res, err := s.obs.Get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	defer res.Close()
	info, err := res.Info()
	if err != nil {
		return nil, nil, err
	}
	if info.Size > uint64(limit) {
		return nil, nil, refuse(CodeCorrupt, name, "%d bytes, more than %d", info.Size, limit)
	}
	b := make([]byte, info.Size)
	if _, err := io.ReadFull(res, b); err != nil {
		return nil, nil, err
	}
	if info.Size == 0 {
		return b, info, nil // nothing was streamed, so nothing to check
	}
	if n, err := res.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		if err == nil || errors.Is(err, io.EOF) {
			err = refuse(CodeCorrupt, name, "longer than its recorded %d bytes", info.Size)
		}
		return nil, nil, err
	}
	return b, info, nil
}

// IDs implements PruneStore.
func (s *ObjectStore) IDs(ctx context.Context) ([]ID, error) {
	names, err := s.list(ctx, "m/")
	var ids []ID
	for _, n := range names {
		seq, epoch, ok := strings.Cut(n, ".")
		var id ID
		var serr, eerr error
		id.Sequence, serr = strconv.ParseUint(seq, 10, 64)
		id.Epoch, eerr = strconv.ParseUint(epoch, 10, 64)
		if ok && serr == nil && eerr == nil {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b ID) int {
		return cmp.Or(cmp.Compare(a.Sequence, b.Sequence), cmp.Compare(a.Epoch, b.Epoch))
	})
	return ids, err
}

// Chunks implements Store.
func (s *ObjectStore) Chunks(ctx context.Context) ([]string, error) { return s.list(ctx, "c/") }

// list names the session's objects under kind ("c/" or "m/"), without it.
// The bucket lists whole: object names are not subjects a filter can pick.
func (s *ObjectStore) list(ctx context.Context, kind string) ([]string, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, info := range infos {
		if rest, ok := strings.CutPrefix(info.Name, s.prefix+kind); ok {
			names = append(names, rest)
		}
	}
	return names, nil
}

// DeleteManifest implements Store.
func (s *ObjectStore) DeleteManifest(ctx context.Context, id ID) error {
	return s.delete(ctx, s.manifest(id))
}

// DeleteChunk implements Store.
func (s *ObjectStore) DeleteChunk(ctx context.Context, digest string) error {
	return s.delete(ctx, s.chunk(digest))
}

func (s *ObjectStore) delete(ctx context.Context, name string) error {
	if err := s.obs.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return err
	}
	return nil
}
