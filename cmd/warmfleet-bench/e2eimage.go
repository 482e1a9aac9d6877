package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fileLayer is a gzip layer written once to a file, its digests computed
// while it was written: a multi-GB image is built and pushed without being
// held in memory or read twice to be hashed.
type fileLayer struct {
	path           string
	digest, diffID v1.Hash
	size           int64
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return gunzipFile(l.path) }

type gunzipped struct {
	*gzip.Reader
	f *os.File
}

func (g gunzipped) Close() error { _ = g.Reader.Close(); return g.f.Close() }

func gunzipFile(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return gunzipped{zr, f}, nil
}

// countingHash is a writer that hashes and counts.
type countingHash struct {
	h hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", c.h.Sum(nil))}
}

// writeRandomLayer writes a gzip layer holding one file of n pseudo-random
// bytes (incompressible, as weights and CUDA libraries nearly are) drawn
// from seed, into dir.
func writeRandomLayer(ctx context.Context, dir string, n int64, seed uint64) (*fileLayer, error) {
	path := filepath.Join(dir, fmt.Sprintf("layer-%016x.tar.gz", seed))
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	compressed := &countingHash{h: sha256.New()}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(f, compressed), gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	diff := &countingHash{h: sha256.New()}
	tw := tar.NewWriter(io.MultiWriter(zw, diff))
	name := fmt.Sprintf("layers/%016x.bin", seed)
	if err := tw.WriteHeader(&tar.Header{Name: "layers/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: n}); err != nil {
		return nil, err
	}
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	rng := rand.NewChaCha8(key)
	const piece = 4 << 20
	for left := n; left > 0; left -= piece {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := io.CopyN(tw, rng, min(left, piece)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &fileLayer{path: path, digest: compressed.sum(), diffID: diff.sum(), size: compressed.n}, nil
}

// imageFamily is a set of images on one base: the base image plus
// baseLayers random layers shared by every variant, and per variant
// topLayers random layers of its own, as images built FROM one CUDA base
// share it.
type imageFamily struct {
	base       v1.Image
	rootLayers int   // the root image's own layers, first in every variant
	baseBytes  int64 // compressed bytes of the random base layers
	variants   []familyImage
}

// familyImage is one variant.
type familyImage struct {
	img      v1.Image
	top      []v1.Hash // its own layers' digests
	topBytes int64     // their compressed bytes
	layers   []v1.Hash // every layer, base first
	diffIDs  []v1.Hash
	bytes    int64 // every layer's compressed bytes
}

// buildImageFamily writes the family's layers into dir: each random layer
// holds layerBytes, baseLayers of them shared, topLayers per variant. seed
// makes the bytes (and so the digests) of one run distinct from another's.
func buildImageFamily(ctx context.Context, dir string, root v1.Image, layerBytes int64, baseLayers, topLayers, variants int, seed uint64) (*imageFamily, error) {
	if baseLayers < 0 || topLayers < 1 || variants < 1 || layerBytes < 1 {
		return nil, fmt.Errorf("image family: %d base layers, %d top layers, %d variants of %d-byte layers", baseLayers, topLayers, variants, layerBytes)
	}
	rl, err := root.Layers()
	if err != nil {
		return nil, err
	}
	fam := &imageFamily{base: root, rootLayers: len(rl)}
	for i := range baseLayers {
		l, err := writeRandomLayer(ctx, dir, layerBytes, seed+uint64(i))
		if err != nil {
			return nil, err
		}
		fam.baseBytes += l.size
		if fam.base, err = mutate.AppendLayers(fam.base, l); err != nil {
			return nil, err
		}
	}
	for v := range variants {
		img := fam.base
		fi := familyImage{}
		for j := range topLayers {
			l, err := writeRandomLayer(ctx, dir, layerBytes, seed+uint64(1000*(v+1)+j))
			if err != nil {
				return nil, err
			}
			fi.top, fi.topBytes = append(fi.top, l.digest), fi.topBytes+l.size
			if img, err = mutate.AppendLayers(img, l); err != nil {
				return nil, err
			}
		}
		ls, err := img.Layers()
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			d, err := l.Digest()
			if err != nil {
				return nil, err
			}
			diff, err := l.DiffID()
			if err != nil {
				return nil, err
			}
			n, err := l.Size()
			if err != nil {
				return nil, err
			}
			fi.layers, fi.diffIDs, fi.bytes = append(fi.layers, d), append(fi.diffIDs, diff), fi.bytes+n
		}
		fi.img = img
		fam.variants = append(fam.variants, fi)
	}
	return fam, nil
}
