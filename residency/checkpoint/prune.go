package checkpoint

import (
	"context"
	"errors"
	"fmt"
)

// PruneStats counts what Forget or Prune deleted.
type PruneStats struct {
	Manifests, Chunks int
}

// Forget deletes checkpoints drop and every chunk of theirs that no
// checkpoint in keep names: the content of checkpoints a session no
// longer keeps. A kept checkpoint that cannot be read stops it before
// anything is deleted: its chunks are unknown.
func Forget(ctx context.Context, store PruneStore, drop, keep []ID) (PruneStats, error) {
	var st PruneStats
	c, err := newCodec()
	if err != nil {
		return st, err
	}
	defer c.close()
	_, err = forget(ctx, store, c, drop, keep, &st)
	return st, err
}

// forget is Forget with the caller's codec; it returns the chunks keep
// names.
func forget(ctx context.Context, store PruneStore, c *codec, drop, keep []ID, st *PruneStats) (map[string]bool, error) {
	named, err := chunksOf(ctx, store, c, keep)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: forget: %w", err)
	}
	for _, id := range drop {
		// A checkpoint already gone (a forget that stopped half-way, run
		// again) leaves only its record to delete.
		mine, err := chunksOf(ctx, store, c, []ID{id})
		if err != nil && !errors.Is(err, ErrIncomplete) {
			return nil, fmt.Errorf("checkpoint: forget: %w", err)
		}
		for d := range mine {
			if named[d] {
				continue
			}
			if err := store.DeleteChunk(ctx, d); err != nil {
				return nil, fmt.Errorf("checkpoint: forget %s: chunk %s: %w", id, d, err)
			}
			st.Chunks++
		}
		if err := store.DeleteManifest(ctx, id); err != nil {
			return nil, fmt.Errorf("checkpoint: forget %s: %w", id, err)
		}
		st.Manifests++
	}
	return named, nil
}

// Prune keeps the newest keep checkpoints of the session and deletes the
// rest (Forget), then sweeps every chunk no kept checkpoint names (those a
// failed Take left). It lists the whole store, and must not run beside a
// Take of the same session, whose chunks no manifest names yet.
func Prune(ctx context.Context, store PruneStore, keep int) (PruneStats, error) {
	if keep < 1 {
		return PruneStats{}, fmt.Errorf("checkpoint: prune: keep %d: at least 1", keep)
	}
	ids, err := store.IDs(ctx)
	if err != nil {
		return PruneStats{}, err
	}
	c, err := newCodec()
	if err != nil {
		return PruneStats{}, err
	}
	defer c.close()
	var st PruneStats
	cut := max(len(ids)-keep, 0)
	named, err := forget(ctx, store, c, ids[:cut], ids[cut:], &st)
	if err != nil {
		return st, err
	}
	chunks, err := store.Chunks(ctx)
	if err != nil {
		return st, err
	}
	for _, d := range chunks {
		if named[d] {
			continue
		}
		if err := store.DeleteChunk(ctx, d); err != nil {
			return st, fmt.Errorf("checkpoint: prune chunk %s: %w", d, err)
		}
		st.Chunks++
	}
	return st, nil
}

// chunksOf is the set of chunks checkpoints ids name: their files' and
// their manifests' pieces.
func chunksOf(ctx context.Context, store Store, c *codec, ids []ID) (map[string]bool, error) {
	named := map[string]bool{}
	for _, id := range ids {
		m, ix, err := load(ctx, store, c, id)
		if err != nil {
			return nil, err
		}
		for _, p := range ix.Pieces {
			named[p] = true
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				named[c] = true
			}
		}
	}
	return named, nil
}
