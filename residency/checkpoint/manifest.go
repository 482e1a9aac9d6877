package checkpoint

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"path"
	"strings"
)

// Kind is what a workspace entry is. Sockets, pipes and devices are not
// checkpointed (Take lists them as skipped).
type Kind string

const (
	KindDir     Kind = "dir"
	KindFile    Kind = "file"
	KindSymlink Kind = "symlink"
)

// Limits a manifest is held to, so a hostile or damaged one is refused
// before anything is written.
const (
	Version          = 1
	MinChunkSize     = 64 << 10
	MaxChunkSize     = 64 << 20
	DefaultChunkSize = 1 << 20
	MaxEntries       = 1 << 20
	MaxManifestBytes = 256 << 20
	maxPathBytes     = 4096
	maxNameBytes     = 255
	// ModeBits are the mode bits a checkpoint keeps: permissions and the
	// sticky bit. Setuid and setgid are dropped: a restore runs as the
	// agent, and a workload must not mint privileged files on a host.
	ModeBits = 0o1777
)

// Entry is one directory, file or symlink of a workspace.
type Entry struct {
	// Path is slash-separated, relative to the workspace root, clean.
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	// Mode holds ModeBits only.
	Mode uint32 `json:"mode"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	// MTimeNanos is the modification time (Unix nanoseconds); Take reuses
	// an unchanged file's chunks by size, mode and mtime.
	MTimeNanos int64 `json:"mtime_ns"`
	// Size and Chunks are a file's: the lowercase hex SHA-256 of each
	// Manifest.ChunkSize piece in order, the last one shorter.
	Size   int64    `json:"size,omitempty"`
	Chunks []string `json:"chunks,omitempty"`
	// Target is a symlink's, kept as written (it is data: Restore never
	// follows it).
	Target string `json:"target,omitempty"`
}

// Manifest is one checkpoint of a workspace: its entries sorted by path,
// each parent directory before what it holds.
type Manifest struct {
	Version   int     `json:"version"`
	ChunkSize int64   `json:"chunk_size"`
	Entries   []Entry `json:"entries"`
}

// Bytes is the total size of the manifest's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// chunkLen is the size of chunk i of an entry of size bytes.
func (m *Manifest) chunkLen(size int64, i int) int64 {
	return min(m.ChunkSize, size-int64(i)*m.ChunkSize)
}

// Encode returns m as stored.
func (m *Manifest) Encode() ([]byte, error) { return json.Marshal(m) }

// DecodeManifest reads a stored manifest and validates it.
func DecodeManifest(b []byte) (Manifest, error) {
	if len(b) > MaxManifestBytes {
		return Manifest{}, refuse(CodeInvalid, "", "manifest of %d bytes is over the %d-byte limit", len(b), MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, refuse(CodeInvalid, "", "not a manifest: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Manifest{}, refuse(CodeInvalid, "", "trailing data after the manifest")
	}
	return m, m.Validate()
}

// Validate checks what Restore relies on: every path clean, relative and
// inside the workspace, sorted and unique, every parent an earlier
// directory entry (so no write ever passes through a symlink), and each
// file's chunks matching its size.
func (m *Manifest) Validate() error {
	if m.Version != Version {
		return refuse(CodeInvalid, "", "version %d: want %d", m.Version, Version)
	}
	if m.ChunkSize < MinChunkSize || m.ChunkSize > MaxChunkSize {
		return refuse(CodeInvalid, "", "chunk_size %d: want %d..%d bytes", m.ChunkSize, MinChunkSize, MaxChunkSize)
	}
	if len(m.Entries) > MaxEntries {
		return refuse(CodeInvalid, "", "%d entries: at most %d", len(m.Entries), MaxEntries)
	}
	dirs := map[string]bool{".": true}
	for i := range m.Entries {
		e := &m.Entries[i]
		if err := validPath(e.Path); err != nil {
			return err
		}
		if i > 0 && e.Path <= m.Entries[i-1].Path {
			return refuse(CodeInvalid, e.Path, "entries must be sorted by path, each once")
		}
		if !dirs[path.Dir(e.Path)] {
			return refuse(CodeInvalid, e.Path, "its parent is not a directory entry before it")
		}
		if err := m.validEntry(e); err != nil {
			return err
		}
		if e.Kind == KindDir {
			dirs[e.Path] = true
		}
	}
	return nil
}

func (m *Manifest) validEntry(e *Entry) error {
	if e.Mode&^ModeBits != 0 {
		return refuse(CodeInvalid, e.Path, "mode %o: only permission and sticky bits (%o)", e.Mode, ModeBits)
	}
	if e.Kind != KindFile && (e.Size != 0 || len(e.Chunks) != 0) {
		return refuse(CodeInvalid, e.Path, "a %s has no size or chunks", e.Kind)
	}
	if e.Kind != KindSymlink && e.Target != "" {
		return refuse(CodeInvalid, e.Path, "a %s has no target", e.Kind)
	}
	switch e.Kind {
	case KindDir:
	case KindSymlink:
		if e.Target == "" || len(e.Target) > maxPathBytes || strings.IndexByte(e.Target, 0) >= 0 {
			return refuse(CodeInvalid, e.Path, "symlink target: 1..%d bytes, no NUL", maxPathBytes)
		}
	case KindFile:
		if e.Size < 0 {
			return refuse(CodeInvalid, e.Path, "size %d is negative", e.Size)
		}
		if want := (e.Size + m.ChunkSize - 1) / m.ChunkSize; int64(len(e.Chunks)) != want {
			return refuse(CodeInvalid, e.Path, "%d chunks for %d bytes: want %d", len(e.Chunks), e.Size, want)
		}
		for _, c := range e.Chunks {
			if !ValidDigest(c) {
				return refuse(CodeInvalid, e.Path, "chunk %q is not a lowercase hex SHA-256", c)
			}
		}
	default:
		return refuse(CodeInvalid, e.Path, "kind %q: want dir, file or symlink", e.Kind)
	}
	return nil
}

// validPath refuses a path that is empty, absolute, unclean, climbs out
// of the workspace or is too long.
func validPath(p string) error {
	switch {
	case p == "" || p == "." || len(p) > maxPathBytes:
		return refuse(CodeInvalid, p, "path: 1..%d bytes, not the root itself", maxPathBytes)
	case strings.IndexByte(p, 0) >= 0 || path.IsAbs(p) || path.Clean(p) != p:
		return refuse(CodeInvalid, p, "path must be relative and clean, with no NUL")
	}
	for el := range strings.SplitSeq(p, "/") {
		if el == ".." || len(el) > maxNameBytes {
			return refuse(CodeInvalid, p, "path element %q: no \"..\", at most %d bytes", el, maxNameBytes)
		}
	}
	return nil
}

// ValidDigest reports whether s names a chunk: lowercase hex SHA-256.
func ValidDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
