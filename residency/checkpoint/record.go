package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// A checkpoint's record under its sequence is a small index: the
// compressed manifest is stored as chunks like any file's (so a manifest
// of any size travels in pieces that fit a message), and the index names
// them. A checkpoint exists once its index does.
type index struct {
	// Pieces are the digests of the compressed manifest's pieces, in order.
	Pieces []string `json:"manifest_pieces"`
	// Bytes is the compressed manifest's size.
	Bytes int64 `json:"manifest_bytes"`
}

// maxIndexBytes bounds a stored index: 4,096 pieces of a manifest at most.
const maxIndexBytes = 4096*70 + 64

// putManifest stores m as checkpoint id: its pieces, then its index. It
// returns the bytes sent.
func putManifest(ctx context.Context, store Store, c *codec, m *Manifest, id ID, pieceSize int64) (int64, error) {
	b, err := m.Encode()
	if err != nil {
		return 0, err
	}
	z := c.enc.EncodeAll(b, nil)
	ix := index{Bytes: int64(len(z))}
	var sent int64
	for off := int64(0); off < int64(len(z)); off += pieceSize {
		piece := z[off:min(off+pieceSize, int64(len(z)))]
		sum := sha256.Sum256(piece)
		d := hex.EncodeToString(sum[:])
		ix.Pieces = append(ix.Pieces, d)
		has, err := store.HasChunk(ctx, d)
		if err != nil {
			return sent, err
		}
		if !has {
			if err := store.PutChunk(ctx, d, Chunk{Data: piece}); err != nil {
				return sent, fmt.Errorf("checkpoint: put %s: %w", id, err)
			}
			sent += int64(len(piece))
		}
	}
	rec, err := json.Marshal(ix)
	if err != nil {
		return sent, err
	}
	if err := store.PutManifest(ctx, id, rec); err != nil {
		return sent, fmt.Errorf("checkpoint: put %s: %w", id, err)
	}
	return sent + int64(len(rec)), nil
}

// loadIndex reads and checks checkpoint id's index.
func loadIndex(ctx context.Context, store Store, id ID) (index, error) {
	what := id.String()
	rec, err := store.GetManifest(ctx, id)
	if err != nil {
		return index{}, err
	}
	var ix index
	dec := json.NewDecoder(bytes.NewReader(rec))
	dec.DisallowUnknownFields()
	if len(rec) > maxIndexBytes || dec.Decode(&ix) != nil || ix.Bytes < 0 || ix.Bytes > MaxManifestBytes || len(ix.Pieces) == 0 {
		return index{}, refuse(CodeCorrupt, what, "its record is not a manifest index")
	}
	for _, d := range ix.Pieces {
		if !ValidDigest(d) {
			return index{}, refuse(CodeCorrupt, what, "manifest piece %q is not a SHA-256", d)
		}
	}
	return ix, nil
}

// Load reads, checks and validates checkpoint id's manifest from store.
func Load(ctx context.Context, store Store, id ID) (Manifest, error) {
	ix, err := loadIndex(ctx, store, id)
	if err != nil {
		return Manifest{}, err
	}
	z := make([]byte, 0, ix.Bytes)
	for i, d := range ix.Pieces {
		ch, err := store.GetChunk(ctx, d)
		if err != nil {
			return Manifest{}, fmt.Errorf("%s: manifest: %w", id, err)
		}
		if sum := sha256.Sum256(ch.Data); ch.Compressed || hex.EncodeToString(sum[:]) != d || int64(len(z)+len(ch.Data)) > ix.Bytes {
			return Manifest{}, refuse(CodeCorrupt, id.String(), "manifest piece %d does not match its digest", i)
		}
		z = append(z, ch.Data...)
	}
	if int64(len(z)) != ix.Bytes {
		return Manifest{}, refuse(CodeCorrupt, id.String(), "manifest of %d bytes, its index says %d", len(z), ix.Bytes)
	}
	c, err := newCodec()
	if err != nil {
		return Manifest{}, err
	}
	defer c.close()
	b, err := c.open(Chunk{Data: z, Compressed: true}, MaxManifestBytes, id.String()+" manifest")
	if err != nil {
		return Manifest{}, err
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", id, err)
	}
	return m, nil
}
