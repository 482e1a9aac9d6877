package artifactstore

import (
	"path/filepath"
	"testing"
	"time"
)

const fuzzDigest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// FuzzDecodeMeta: whatever a sidecar holds, decoding never panics, and
// what it accepts describes the replica and survives a write and read.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"digest":"` + fuzzDigest + `","size_bytes":0,"verified_at":"2026-12-05T12:00:00Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b, fuzzDigest)
		if err != nil {
			return
		}
		if m.Digest != fuzzDigest || m.SizeBytes < 0 {
			t.Fatalf("accepted %+v", m)
		}
		path := filepath.Join(t.TempDir(), "m.json")
		if err := writeMeta(path, m); err != nil {
			t.Fatal(err)
		}
		back, err := readMeta(path, fuzzDigest)
		if err != nil || back.SizeBytes != m.SizeBytes || !back.VerifiedAt.Equal(m.VerifiedAt) || !back.LastUsedAt.Equal(m.LastUsedAt) {
			t.Fatalf("round trip %+v → %+v, %v", m, back, err)
		}
	})
}

func TestMetaRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	now := time.Now().UTC()
	m := meta{Digest: fuzzDigest, SizeBytes: 42, VerifiedAt: now, LastUsedAt: now.Add(time.Second)}
	if err := writeMeta(path, m); err != nil {
		t.Fatal(err)
	}
	back, err := readMeta(path, fuzzDigest)
	if err != nil || back.SizeBytes != 42 || !back.VerifiedAt.Equal(now) || !back.LastUsedAt.Equal(now.Add(time.Second)) {
		t.Fatalf("%+v %v", back, err)
	}
	other := "sha256:" + "0" + fuzzDigest[8:]
	if _, err := readMeta(path, other); err == nil {
		t.Fatal("a sidecar read as another digest's")
	}
	if _, err := readMeta(filepath.Join(t.TempDir(), "none.json"), fuzzDigest); err == nil {
		t.Fatal("a missing sidecar read")
	}
}
