package artifactstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// maxMetaBytes bounds a sidecar; anything larger is not ours.
const maxMetaBytes = 4096

// meta is a replica's sidecar record, kept beside the blob. The blob is the
// truth; the sidecar remembers times and the seal under which a use may
// skip re-hashing it.
type meta struct {
	Digest     string    `json:"digest"`
	SizeBytes  int64     `json:"size_bytes"`
	VerifiedAt time.Time `json:"verified_at"`
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
	Seal       *seal     `json:"seal,omitempty"`
}

// decodeMeta parses a sidecar and refuses one that does not describe the
// replica digest (a sidecar copied or truncated by hand).
func decodeMeta(b []byte, digest string) (meta, error) {
	var m meta
	if len(b) > maxMetaBytes {
		return meta{}, fmt.Errorf("artifact %s: metadata of %d bytes is too large", digest, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, fmt.Errorf("artifact %s: metadata: %w", digest, err)
	}
	switch {
	case m.Digest != digest:
		return meta{}, fmt.Errorf("artifact %s: metadata names another digest", digest)
	case m.SizeBytes < 0:
		return meta{}, fmt.Errorf("artifact %s: metadata has a negative size", digest)
	}
	return m, nil
}

// readMeta reads the sidecar at path; a missing one is ErrNotFound.
func readMeta(path, digest string) (meta, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, fmt.Errorf("artifact %s: metadata: %w", digest, ErrNotFound)
	}
	if err != nil {
		return meta{}, fmt.Errorf("artifact %s: metadata: %w", digest, err)
	}
	defer f.Close()
	b := make([]byte, maxMetaBytes+1)
	n, err := readFull(f, b)
	if err != nil {
		return meta{}, fmt.Errorf("artifact %s: metadata: %w", digest, err)
	}
	return decodeMeta(b[:n], digest)
}

// writeMeta replaces the sidecar at path atomically: a temp file in the
// same directory renamed over it, so a crash leaves the old or the new one.
func writeMeta(path string, m meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("artifact %s: metadata: %w", m.Digest, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*"+tmpSuffix)
	if err != nil {
		return fmt.Errorf("artifact %s: metadata: %w", m.Digest, err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("artifact %s: metadata: %w", m.Digest, err)
	}
	return nil
}
