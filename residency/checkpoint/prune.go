package checkpoint

import (
	"context"
	"fmt"
)

// PruneStats counts what Prune deleted.
type PruneStats struct {
	Manifests, Chunks int
}

// Prune keeps the newest keep checkpoints of the session and deletes the
// rest, then every chunk no kept manifest names (those of older
// checkpoints, and any a failed Take left). It must not run beside a Take
// of the same session, whose chunks no manifest names yet: the lease
// holder runs both, one after the other.
func Prune(ctx context.Context, store PruneStore, keep int) (PruneStats, error) {
	var st PruneStats
	if keep < 1 {
		return st, fmt.Errorf("checkpoint: prune: keep %d: at least 1", keep)
	}
	ids, err := store.IDs(ctx)
	if err != nil {
		return st, err
	}
	if len(ids) == 0 {
		return st, nil
	}
	cut := max(len(ids)-keep, 0)
	for _, id := range ids[:cut] {
		if err := store.DeleteManifest(ctx, id); err != nil {
			return st, fmt.Errorf("checkpoint: prune %s: %w", id, err)
		}
		st.Manifests++
	}
	named := map[string]bool{}
	for _, id := range ids[cut:] {
		m, err := Load(ctx, store, id)
		if err != nil {
			// A kept checkpoint that cannot be read names nothing we can
			// trust: sweeping on would delete chunks it may need.
			return st, fmt.Errorf("checkpoint: prune: %w", err)
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				named[c] = true
			}
		}
		ix, err := loadIndex(ctx, store, id)
		if err != nil {
			return st, fmt.Errorf("checkpoint: prune: %w", err)
		}
		for _, p := range ix.Pieces {
			named[p] = true
		}
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
