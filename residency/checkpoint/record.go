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
		n, err := putIfAbsent(ctx, store, d, func() Chunk { return Chunk{Data: piece} })
		if err != nil {
			return sent, fmt.Errorf("checkpoint: put %s: %w", id, err)
		}
		sent += n
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
	c, err := newCodec()
	if err != nil {
		return Manifest{}, err
	}
	defer c.close()
	m, _, err := load(ctx, store, c, id)
	return m, err
}

// load is Load with the caller's codec, answering the index it read too.
func load(ctx context.Context, store Store, c *codec, id ID) (Manifest, index, error) {
	ix, err := loadIndex(ctx, store, id)
	if err != nil {
		return Manifest{}, ix, err
	}
	z := make([]byte, 0, ix.Bytes)
	for i, d := range ix.Pieces {
		what := fmt.Sprintf("%s manifest piece %d", id, i)
		piece, ch, err := getChunk(ctx, store, c, d, ix.Bytes-int64(len(z)), what)
		if err != nil {
			return Manifest{}, ix, err
		}
		if ch.Compressed {
			return Manifest{}, ix, refuse(CodeCorrupt, what, "stored compressed: a piece is stored as it is")
		}
		z = append(z, piece...)
	}
	if int64(len(z)) != ix.Bytes {
		return Manifest{}, ix, refuse(CodeCorrupt, id.String(), "manifest of %d bytes, its index says %d", len(z), ix.Bytes)
	}
	b, err := c.open(Chunk{Data: z, Compressed: true}, MaxManifestBytes, id.String()+" manifest")
	if err != nil {
		return Manifest{}, ix, err
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return Manifest{}, ix, fmt.Errorf("%s: %w", id, err)
	}
	return m, ix, nil
}
