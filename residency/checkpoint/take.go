package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// Options tune Take.
type Options struct {
	// ChunkSize is how files are cut (0: DefaultChunkSize).
	ChunkSize int64
	// Previous is the session's last checkpoint: a file whose size, mode,
	// owner and mtime are unchanged since reuses its chunks unread.
	Previous *Manifest
	// Workers hash, seal and send that many chunks at once (0:
	// DefaultWorkers).
	Workers int
}

// TakeStats says what a checkpoint held and what it cost.
type TakeStats struct {
	Files, Dirs, Symlinks int
	// Skipped are the sockets, pipes and devices left out (the first 32;
	// SkippedCount counts them all).
	Skipped      []string
	SkippedCount int
	// Bytes is the files' total size; BytesRead what was read from disk
	// (files new or changed since Previous).
	Bytes, BytesRead int64
	// Chunks the manifest names; ChunksMoved those the store lacked.
	Chunks, ChunksMoved int
	// BytesMoved is what was sent to the store: the new chunks (as
	// stored, compressed where that paid) and the manifest.
	BytesMoved int64
}

// Take checkpoints the workspace at root into store as checkpoint id: the
// chunks the store lacks, then the manifest. The workspace should be
// quiet (a file written meanwhile is caught as it was read; its chunks
// always match their digests). A Take that fails leaves no manifest; the
// chunks it sent are swept by the next Prune.
func Take(ctx context.Context, root string, store Store, id ID, opt Options) (Manifest, TakeStats, error) {
	m := Manifest{Version: Version, ChunkSize: opt.ChunkSize}
	if m.ChunkSize == 0 {
		m.ChunkSize = DefaultChunkSize
	}
	if m.ChunkSize < MinChunkSize || m.ChunkSize > MaxChunkSize {
		return Manifest{}, TakeStats{}, fmt.Errorf("checkpoint: chunk size %d: want %d..%d bytes", m.ChunkSize, MinChunkSize, MaxChunkSize)
	}
	var st TakeStats
	if err := scan(root, &m, &st); err != nil {
		return Manifest{}, st, err
	}
	toRead := reuse(&m, opt.Previous)
	c, err := newCodec()
	if err != nil {
		return Manifest{}, st, err
	}
	defer c.close()
	if err := sendChunks(ctx, root, &m, toRead, store, c, max(opt.Workers, 0), &st); err != nil {
		return Manifest{}, st, err
	}
	for _, e := range m.Entries {
		st.Bytes += e.Size
		st.Chunks += len(e.Chunks)
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, st, fmt.Errorf("checkpoint: %s: %w", root, err)
	}
	sent, err := putManifest(ctx, store, c, &m, id, m.ChunkSize)
	st.BytesMoved += sent
	if err != nil {
		return Manifest{}, st, err
	}
	return m, st, nil
}

// scan lists root's entries into m, sorted by path, without following
// symlinks; a file's size is filled in as it is read.
func scan(root string, m *Manifest, st *TakeStats) error {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("checkpoint: walk %s: %w", p, err)
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("checkpoint: %s: %w", p, err)
		}
		e := Entry{Path: filepath.ToSlash(rel), Mode: uint32(info.Mode().Perm())}
		if info.Mode()&fs.ModeSticky != 0 {
			e.Mode |= 0o1000
		}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			e.UID, e.GID = sys.Uid, sys.Gid
		}
		e.MTimeNanos = info.ModTime().UnixNano()
		switch {
		case d.IsDir():
			e.Kind = KindDir
			st.Dirs++
		case info.Mode().IsRegular():
			e.Kind, e.Size = KindFile, info.Size()
			st.Files++
		case info.Mode()&fs.ModeSymlink != 0:
			if e.Target, err = os.Readlink(p); err != nil {
				return fmt.Errorf("checkpoint: %s: %w", p, err)
			}
			e.Kind = KindSymlink
			st.Symlinks++
		default:
			if len(st.Skipped) < 32 {
				st.Skipped = append(st.Skipped, e.Path)
			}
			st.SkippedCount++
			return nil
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
	slices.SortFunc(m.Entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return err
}

// reuse gives each file unchanged since prev its chunks there, and returns
// the positions of the files that must be read.
func reuse(m *Manifest, prev *Manifest) []int {
	old := map[string]*Entry{}
	if prev != nil && prev.ChunkSize == m.ChunkSize {
		for i := range prev.Entries {
			old[prev.Entries[i].Path] = &prev.Entries[i]
		}
	}
	var read []int
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Kind != KindFile {
			continue
		}
		if p := old[e.Path]; p != nil && p.Kind == KindFile && p.Size == e.Size && p.Mode == e.Mode &&
			p.UID == e.UID && p.GID == e.GID && p.MTimeNanos == e.MTimeNanos {
			e.Chunks = slices.Clone(p.Chunks)
			continue
		}
		read = append(read, i)
	}
	return read
}

// chunkJob is one piece of a file on its way to the store.
type chunkJob struct {
	entry, index int
	buf          []byte
}

// sendChunks reads the files at positions read, cutting each into chunks
// that workers hash and, when the store lacks them, seal and put.
func sendChunks(ctx context.Context, root string, m *Manifest, read []int, store Store, c *codec, workers int, st *TakeStats) error {
	if workers == 0 {
		workers = DefaultWorkers
	}
	g, ctx := errgroup.WithContext(ctx)
	jobs := make(chan chunkJob, workers)
	pool := sync.Pool{New: func() any { return make([]byte, m.ChunkSize) }}
	var mu sync.Mutex
	digests := map[[2]int]string{}
	seen := map[string]bool{}
	counts := make([]int, len(m.Entries))
	g.Go(func() error {
		defer close(jobs)
		for _, i := range read {
			n, size, err := readFile(ctx, filepath.Join(root, filepath.FromSlash(m.Entries[i].Path)), i, jobs, &pool, m.ChunkSize)
			if err != nil {
				return err
			}
			counts[i] = n
			m.Entries[i].Size = size
			st.BytesRead += size
		}
		return nil
	})
	for range workers {
		g.Go(func() error {
			for j := range jobs {
				sum := sha256.Sum256(j.buf)
				d := hex.EncodeToString(sum[:])
				mu.Lock()
				digests[[2]int{j.entry, j.index}] = d
				fresh := !seen[d]
				seen[d] = true
				mu.Unlock()
				var moved int64
				var err error
				if fresh {
					moved, err = putIfAbsent(ctx, store, d, func() Chunk { return c.seal(j.buf) })
				}
				pool.Put(j.buf[:cap(j.buf)])
				if err != nil {
					return err
				}
				if moved > 0 {
					mu.Lock()
					st.ChunksMoved++
					st.BytesMoved += moved
					mu.Unlock()
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, i := range read {
		chunks := make([]string, counts[i])
		for k := range chunks {
			chunks[k] = digests[[2]int{i, k}]
		}
		m.Entries[i].Chunks = chunks
	}
	return nil
}

// putIfAbsent stores chunk digest, made by chunk, unless the store holds
// it, and returns the bytes sent.
func putIfAbsent(ctx context.Context, store Store, digest string, chunk func() Chunk) (int64, error) {
	has, err := store.HasChunk(ctx, digest)
	if err != nil || has {
		return 0, err
	}
	ch := chunk()
	if err := store.PutChunk(ctx, digest, ch); err != nil {
		return 0, fmt.Errorf("checkpoint: put chunk %s: %w", digest, err)
	}
	return int64(len(ch.Data)), nil
}

// readFile cuts the regular file at p into chunks sent on jobs, and
// returns how many and the bytes read (the size it has now). It refuses to
// follow a symlink that replaced the file since the scan.
func readFile(ctx context.Context, p string, entry int, jobs chan<- chunkJob, pool *sync.Pool, size int64) (int, int64, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("checkpoint: read %s: %w", p, err)
	}
	defer f.Close()
	var total int64
	for n := 0; ; n++ {
		buf := pool.Get().([]byte)[:size]
		k, err := io.ReadFull(f, buf)
		if k > 0 {
			if !send(ctx, jobs, chunkJob{entry: entry, index: n, buf: buf[:k]}) {
				return 0, 0, ctx.Err()
			}
			total += int64(k)
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			if k > 0 {
				n++
			}
			return n, total, nil
		case err != nil:
			return 0, 0, fmt.Errorf("checkpoint: read %s: %w", p, err)
		}
	}
}
