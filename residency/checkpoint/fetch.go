package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// fetched is one chunk of a restore: seq is its place in the restore's
// order (entries in order, each file's chunks in order); data, once
// fetched, is its verified content and stored what the store sent.
type fetched struct {
	seq, entry, index int
	data              []byte
	stored            int64
}

// fetchChunks fills every file with its chunks: workers fetch and verify
// them at once, and one writer appends them to their files in order, so
// each file is written front to back as a plain copy would write it. At
// most 2×workers chunks are ahead of the writer.
func fetchChunks(ctx context.Context, store Store, c *codec, m *Manifest, dir string, workers int, st *RestoreStats) error {
	if workers == 0 {
		workers = DefaultWorkers
	}
	g, ctx := errgroup.WithContext(ctx)
	jobs, results := make(chan fetched), make(chan fetched, workers)
	window := make(chan struct{}, 2*workers)
	g.Go(func() error {
		defer close(jobs)
		seq := 0
		for i, e := range m.Entries {
			for k := range e.Chunks {
				if !send(ctx, window, struct{}{}) || !send(ctx, jobs, fetched{seq: seq, entry: i, index: k}) {
					return ctx.Err()
				}
				seq++
			}
		}
		return nil
	})
	var live sync.WaitGroup
	for range workers {
		live.Add(1)
		g.Go(func() error {
			defer live.Done()
			for {
				select {
				case j, ok := <-jobs:
					if !ok {
						return nil
					}
					if err := fetchChunk(ctx, store, c, m, &j); err != nil {
						return err
					}
					if !send(ctx, results, j) {
						return ctx.Err()
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		})
	}
	g.Go(func() error {
		live.Wait()
		close(results)
		return nil
	})
	g.Go(func() error { return writeInOrder(ctx, m, dir, results, window, st) })
	return g.Wait()
}

func send[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// fetchChunk gets chunk j.index of entry j.entry and checks its size and
// digest.
func fetchChunk(ctx context.Context, store Store, c *codec, m *Manifest, j *fetched) error {
	e := &m.Entries[j.entry]
	want := m.chunkLen(e.Size, j.index)
	data, ch, err := getChunk(ctx, store, c, e.Chunks[j.index], want, fmt.Sprintf("%s chunk %d", e.Path, j.index))
	if err != nil {
		return err
	}
	if int64(len(data)) != want {
		return refuse(CodeCorrupt, e.Path, "chunk %d: %d bytes, want %d", j.index, len(data), want)
	}
	j.data, j.stored = data, int64(len(ch.Data))
	return nil
}

// getChunk reads chunk digest from store and returns its content (at most
// limit bytes), checked against the digest unless the store already did
// (Chunk.Verified), and the chunk as stored. what names it in errors.
func getChunk(ctx context.Context, store Store, c *codec, digest string, limit int64, what string) ([]byte, Chunk, error) {
	ch, err := store.GetChunk(ctx, digest)
	if err != nil {
		return nil, ch, fmt.Errorf("checkpoint: %s (%s): %w", what, digest, err)
	}
	data, err := c.open(ch, limit, what)
	if err != nil {
		return nil, ch, err
	}
	if !ch.Verified {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
			return nil, ch, refuse(CodeCorrupt, what, "digest %x, want %s", sum, digest)
		}
	}
	return data, ch, nil
}

// writeInOrder appends the fetched chunks to their files in seq order,
// freeing a place in window for each one written.
func writeInOrder(ctx context.Context, m *Manifest, dir string, results <-chan fetched, window <-chan struct{}, st *RestoreStats) (err error) {
	pending := map[int]fetched{}
	next, open := 0, -1
	var f *os.File
	defer func() {
		if f != nil {
			err = errors.Join(err, f.Close())
		}
	}()
	for {
		select {
		case r, ok := <-results:
			if !ok {
				return nil
			}
			pending[r.seq] = r
		case <-ctx.Done():
			return ctx.Err()
		}
		for r, ok := pending[next]; ok; r, ok = pending[next] {
			delete(pending, next)
			if r.entry != open {
				if f != nil {
					if err := f.Close(); err != nil {
						return fmt.Errorf("checkpoint: restore %s: %w", m.Entries[open].Path, err)
					}
				}
				open = r.entry
				if f, err = os.OpenFile(filepath.Join(dir, filepath.FromSlash(m.Entries[open].Path)), os.O_WRONLY|syscall.O_NOFOLLOW, 0); err != nil {
					return fmt.Errorf("checkpoint: restore %s: %w", m.Entries[open].Path, err)
				}
			}
			if _, err := f.Write(r.data); err != nil {
				return fmt.Errorf("checkpoint: restore %s: %w", m.Entries[open].Path, err)
			}
			st.Chunks++
			st.BytesFetched += r.stored
			<-window
			next++
		}
	}
}
