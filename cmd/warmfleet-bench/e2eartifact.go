package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// benchArtifact is the artifact every timed Run mounts.
type benchArtifact struct {
	rec schemas.ArtifactRecord
	// storeDir is the agent's replica store, where a cold case removes it.
	storeDir string
}

// putArtifact stores mib MiB of incompressible bytes in the artifact
// bucket and registers them in the catalog as the control plane's admin
// API does for `warmfleet artifact put`.
func putArtifact(ctx context.Context, conn *bus.Conn, mib int) (schemas.ArtifactRecord, error) {
	var key [32]byte
	key[0], key[1] = 0xa7, byte(rand.Uint32())
	st, err := putRandom(ctx, conn.NC, fmt.Sprintf("bench/weights-%x", key[1]), int64(mib)<<20, key)
	if err != nil {
		return schemas.ArtifactRecord{}, err
	}
	rec := schemas.ArtifactRecord{Name: "bench-weights", Version: "v1", Digest: st.Digest, SizeBytes: st.Size,
		Source: schemas.ArtifactSource{Object: st.Name}}
	body, err := json.Marshal(schemas.ArtifactRegistration{Version: schemas.SchemaVersion, Record: rec})
	if err != nil {
		return rec, err
	}
	resp, err := conn.NC.RequestWithContext(ctx, bus.SubjectArtifactRegister, body)
	if err != nil {
		return rec, fmt.Errorf("register artifact: %w", err)
	}
	var rep schemas.Reply[schemas.ArtifactRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return rec, err
	}
	if rep.Refusal != nil || rep.OK == nil {
		return rec, fmt.Errorf("register artifact: refused: %+v", rep.Refusal)
	}
	return *rep.OK, nil
}

// putRandom stores size incompressible bytes (ChaCha8 from key) in the
// artifact bucket as object name, with the uploader `warmfleet artifact
// put` uses.
func putRandom(ctx context.Context, nc *nats.Conn, name string, size int64, key [32]byte) (bus.ObjectStored, error) {
	st, err := bus.PutObject(ctx, nc, bus.ObjectPut{Bucket: bus.ObjectBucketArtifacts, Name: name}, io.LimitReader(rand.NewChaCha8(key), size))
	if err != nil {
		return st, fmt.Errorf("put %d MiB: %w", size>>20, err)
	}
	return st, nil
}

// rawArtifact is the transfer floor for the artifact: a plain object Get
// through the link, discarded.
func rawArtifact(ctx context.Context, conn *bus.Conn, object string) (int64, error) {
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		return 0, err
	}
	r, err := obs.Get(ctx, object)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return io.Copy(io.Discard, r)
}

// removeReplica deletes the agent's replica of digest with the store's own
// Remove (it refuses one in use) and checks it is gone.
func (b benchArtifact) removeReplica() error {
	s, err := artifactstore.New(b.storeDir)
	if err != nil {
		return err
	}
	if err := s.Remove(b.rec.Digest); err != nil && !errors.Is(err, artifactstore.ErrNotFound) {
		return err
	}
	if _, err := os.Stat(s.Path(b.rec.Digest)); !os.IsNotExist(err) {
		return fmt.Errorf("artifact replica %s survived its removal: %v", b.rec.Digest, err)
	}
	return nil
}
