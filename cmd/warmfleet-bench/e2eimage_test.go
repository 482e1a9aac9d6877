package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
)

// Variants of one family share the base layers by digest and nothing else,
// and each layer's recorded digests are those of its bytes.
func TestImageFamilySharesBaseByDigest(t *testing.T) {
	fam, err := buildImageFamily(context.Background(), t.TempDir(), empty.Image, 256<<10, 2, 2, 2, 42)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fam.variants[0], fam.variants[1]
	if len(a.layers) != 4 || len(b.layers) != 4 {
		t.Fatalf("layers %d and %d, want 4 each", len(a.layers), len(b.layers))
	}
	for i := range 2 {
		if a.layers[i] != b.layers[i] || a.diffIDs[i] != b.diffIDs[i] {
			t.Fatalf("base layer %d differs: %s vs %s", i, a.layers[i], b.layers[i])
		}
	}
	seen := map[string]bool{}
	for _, d := range append(append([]string(nil), a.top[0].String(), a.top[1].String()), b.top[0].String(), b.top[1].String()) {
		if seen[d] {
			t.Fatalf("top layer %s shared", d)
		}
		seen[d] = true
	}
	if a.topBytes <= 256<<10 || a.bytes != fam.baseBytes+a.topBytes {
		t.Fatalf("bytes: top %d, all %d, base %d", a.topBytes, a.bytes, fam.baseBytes)
	}
	ma, err := a.img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	mb, err := b.img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if ma.Config.Digest == mb.Config.Digest {
		t.Fatal("variants share a config")
	}
	// The recorded digests are the bytes' own: re-read each layer.
	ls, err := a.img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		fl := l.(*fileLayer)
		rc, err := fl.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		got, n := hashReader(t, rc)
		if got != fl.digest.String() || n != fl.size {
			t.Fatalf("layer %d: file hashes to %s (%d bytes), recorded %s (%d)", i, got, n, fl.digest, fl.size)
		}
		rc, err = fl.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := hashReader(t, rc); got != fl.diffID.String() {
			t.Fatalf("layer %d: diff ID %s, recorded %s", i, got, fl.diffID)
		}
	}
}

func hashReader(t *testing.T, rc io.ReadCloser) (string, int64) {
	t.Helper()
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil)), n
}
