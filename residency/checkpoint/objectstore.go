package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ObjectStore keeps one session's checkpoints in a NATS object store
// bucket: chunks as <tenant>/<session>/c/<digest>, manifests as
// <tenant>/<session>/m/<sequence, 20 digits>. Chunks are not shared
// between sessions, so one session's content reveals nothing of another's
// and pruning one never touches another.
type ObjectStore struct {
	obs    jetstream.ObjectStore
	prefix string
}

var _ Store = (*ObjectStore)(nil)

// NewObjectStore is the session tenant/session's store in obs.
func NewObjectStore(obs jetstream.ObjectStore, tenant, session string) (*ObjectStore, error) {
	for _, part := range []string{tenant, session} {
		if part == "" || strings.ContainsAny(part, "/.*> \t\n") {
			return nil, fmt.Errorf("checkpoint: store name %q: a tenant or session id, not empty, no '/', '.', '*', '>' or space", part)
		}
	}
	return &ObjectStore{obs: obs, prefix: tenant + "/" + session + "/"}, nil
}

func (s *ObjectStore) chunk(d string) string      { return s.prefix + "c/" + d }
func (s *ObjectStore) manifest(seq uint64) string { return fmt.Sprintf("%sm/%020d", s.prefix, seq) }

// HasChunk implements Store.
func (s *ObjectStore) HasChunk(ctx context.Context, digest string) (bool, error) {
	_, err := s.obs.GetInfo(ctx, s.chunk(digest))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, nil
	}
	return err == nil, err
}

// PutChunk implements Store.
func (s *ObjectStore) PutChunk(ctx context.Context, digest string, frame []byte) error {
	_, err := s.obs.PutBytes(ctx, s.chunk(digest), frame)
	return err
}

// GetChunk implements Store.
func (s *ObjectStore) GetChunk(ctx context.Context, digest string) ([]byte, error) {
	return s.get(ctx, s.chunk(digest))
}

// PutManifest implements Store.
func (s *ObjectStore) PutManifest(ctx context.Context, seq uint64, frame []byte) error {
	_, err := s.obs.PutBytes(ctx, s.manifest(seq), frame)
	return err
}

// GetManifest implements Store.
func (s *ObjectStore) GetManifest(ctx context.Context, seq uint64) ([]byte, error) {
	return s.get(ctx, s.manifest(seq))
}

// getTimeout bounds one object read.
const getTimeout = time.Minute

// get reads one object whole. The read is not cancelled with ctx: nats.go
// stops delivering an object's chunks once its context is cancelled but
// leaves its reader waiting for them until the deadline, so a read is let
// finish (an object is at most MaxChunkSize) and ctx is checked after.
func (s *ObjectStore) get(ctx context.Context, name string) ([]byte, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), getTimeout)
	defer cancel()
	b, err := s.obs.GetBytes(rctx, name)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return nil, ctxErr
	}
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, refuse(CodeIncomplete, name, "not in the store")
	case errors.Is(err, jetstream.ErrDigestMismatch):
		return nil, refuse(CodeCorrupt, name, "the object store's digest does not match its content")
	}
	return b, err
}

// Sequences implements Store.
func (s *ObjectStore) Sequences(ctx context.Context) ([]uint64, error) {
	names, err := s.list(ctx, "m/")
	var seqs []uint64
	for _, n := range names {
		if seq, err := strconv.ParseUint(n, 10, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, err
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
func (s *ObjectStore) DeleteManifest(ctx context.Context, seq uint64) error {
	return s.delete(ctx, s.manifest(seq))
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
