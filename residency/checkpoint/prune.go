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
	named, err := chunksOf(ctx, store, keep)
	if err != nil {
		return st, fmt.Errorf("checkpoint: forget: %w", err)
	}
	for _, id := range drop {
		// A checkpoint already gone (a forget that stopped half-way, run
		// again) leaves only its record to delete.
		mine, err := chunksOf(ctx, store, []ID{id})
		if err != nil && !errors.Is(err, ErrIncomplete) {
			return st, fmt.Errorf("checkpoint: forget: %w", err)
		}
		for c := range mine {
			if named[c] {
				continue
			}
			if err := store.DeleteChunk(ctx, c); err != nil {
				return st, fmt.Errorf("checkpoint: forget %s: chunk %s: %w", id, c, err)
			}
			st.Chunks++
		}
		if err := store.DeleteManifest(ctx, id); err != nil {
			return st, fmt.Errorf("checkpoint: forget %s: %w", id, err)
		}
		st.Manifests++
	}
	return st, nil
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
	cut := max(len(ids)-keep, 0)
	st, err := Forget(ctx, store, ids[:cut], ids[cut:])
	if err != nil {
		return st, err
	}
	named, err := chunksOf(ctx, store, ids[cut:])
	if err != nil {
		return st, err
	}
	chunks, err := store.Chunks(ctx)
	if err != nil {
		return st, err
	}
	for _, c := range chunks {
		if named[c] {
			continue
		}
		if err := store.DeleteChunk(ctx, c); err != nil {
			return st, fmt.Errorf("checkpoint: prune chunk %s: %w", c, err)
		}
		st.Chunks++
	}
	return st, nil
}

// chunksOf is the set of chunks checkpoints ids name: their files' and
// their manifests' pieces.
func chunksOf(ctx context.Context, store Store, ids []ID) (map[string]bool, error) {
	named := map[string]bool{}
	for _, id := range ids {
		ix, err := loadIndex(ctx, store, id)
		if err != nil {
			return nil, err
		}
		for _, p := range ix.Pieces {
			named[p] = true
		}
		m, err := Load(ctx, store, id)
		if err != nil {
			return nil, err
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				named[c] = true
			}
		}
	}
	return named, nil
}
