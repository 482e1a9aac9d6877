package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var digestA = strings.Repeat("a", 64)

func validManifest() Manifest {
	return Manifest{Version: Version, ChunkSize: MinChunkSize, Entries: []Entry{
		{Path: "d", Kind: KindDir, Mode: 0o755},
		{Path: "d/f", Kind: KindFile, Mode: 0o644, Size: 10, Chunks: []string{digestA}},
		{Path: "l", Kind: KindSymlink, Mode: 0o777, Target: "/etc/passwd"},
	}}
}

// TestManifestRefusals: each malformed manifest is refused as invalid,
// naming the path, before anything is written.
func TestManifestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m *Manifest)
	}{
		{"version", func(m *Manifest) { m.Version = 2 }},
		{"chunk size", func(m *Manifest) { m.ChunkSize = 1 }},
		{"parent dir escape", func(m *Manifest) { m.Entries[1].Path = "../f" }},
		{"absolute", func(m *Manifest) { m.Entries[0].Path = "/d" }},
		{"unclean", func(m *Manifest) { m.Entries[1].Path = "d/./f" }},
		{"climbs inside", func(m *Manifest) { m.Entries[1].Path = "d/../f" }},
		{"root itself", func(m *Manifest) { m.Entries[0].Path = "." }},
		{"empty path", func(m *Manifest) { m.Entries[0].Path = "" }},
		{"NUL", func(m *Manifest) { m.Entries[2].Path = "l\x00" }},
		{"long element", func(m *Manifest) { m.Entries[2].Path = strings.Repeat("x", 256) }},
		{"unsorted", func(m *Manifest) { m.Entries[0], m.Entries[2] = m.Entries[2], m.Entries[0] }},
		{"duplicate", func(m *Manifest) { m.Entries[2] = m.Entries[1] }},
		{"no parent", func(m *Manifest) { m.Entries = m.Entries[1:] }},
		{"file under a symlink", func(m *Manifest) {
			m.Entries = []Entry{{Path: "l", Kind: KindSymlink, Target: "/etc"}, {Path: "l/passwd", Kind: KindFile}}
		}},
		{"file under a file", func(m *Manifest) { m.Entries[0].Kind = KindFile }},
		{"setuid", func(m *Manifest) { m.Entries[1].Mode = 0o4755 }},
		{"chunk count", func(m *Manifest) { m.Entries[1].Size = MinChunkSize + 1 }},
		{"negative size", func(m *Manifest) { m.Entries[1].Size = -1 }},
		{"bad digest", func(m *Manifest) { m.Entries[1].Chunks[0] = strings.ToUpper(digestA) }},
		{"dir with chunks", func(m *Manifest) { m.Entries[0].Chunks = []string{digestA} }},
		{"symlink without target", func(m *Manifest) { m.Entries[2].Target = "" }},
		{"file with target", func(m *Manifest) { m.Entries[1].Target = "x" }},
		{"unknown kind", func(m *Manifest) { m.Entries[2].Kind = "fifo" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := validManifest()
			m.Entries = append([]Entry(nil), m.Entries...)
			m.Entries[1].Chunks = []string{digestA}
			tc.edit(&m)
			b, err := json.Marshal(m)
			must(t, err)
			_, err = DecodeManifest(b)
			var ce *Error
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &ce) || ce.Code != CodeInvalid {
				t.Fatalf("%s: %v, want %s", tc.name, err, CodeInvalid)
			}
		})
	}
	m := validManifest()
	b, _ := json.Marshal(m)
	if _, err := DecodeManifest(b); err != nil {
		t.Fatalf("the valid manifest: %v", err)
	}
	for _, bad := range []string{`{"version":1,"chunk_size":65536,"entries":[],"extra":1}`, `{"version":1,"chunk_size":65536,"entries":[]} {}`, `[`} {
		if _, err := DecodeManifest([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want %v", bad, err, ErrInvalid)
		}
	}
}

// TestHostileManifestWritesNothing: a stored manifest that would write
// through a symlink out of the workspace is refused, and nothing outside
// (or inside) is written.
func TestHostileManifestWritesNothing(t *testing.T) {
	ctx := ctxT(t)
	store := sessionStore(t, startBucket(t), "acme", "s1")
	outside := t.TempDir()
	m := Manifest{Version: Version, ChunkSize: MinChunkSize, Entries: []Entry{
		{Path: "escape", Kind: KindSymlink, Target: outside},
		{Path: "escape/owned", Kind: KindFile, Size: 1, Chunks: []string{digestA}},
	}}
	c, err := newCodec()
	must(t, err)
	defer c.close()
	if _, err := putManifest(ctx, store, c, &m, ID{Sequence: 1, Epoch: 1}, MinChunkSize); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	if _, _, err := Restore(ctx, store, ID{Sequence: 1, Epoch: 1}, filepath.Join(parent, "ws"), 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("restore: %v, want %v", err, ErrInvalid)
	}
	for _, dir := range []string{outside, parent} {
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s holds %v after a refused restore", dir, entries)
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	m := validManifest()
	b, _ := json.Marshal(m)
	f.Add(b)
	f.Add([]byte(`{"version":1,"chunk_size":65536,"entries":[{"path":"../x","kind":"file"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refused without its code: %v", err)
			}
			return
		}
		// What decodes is what Restore may write: re-encoded, it decodes
		// the same, and no path leaves the workspace.
		out, err := m.Encode()
		must(t, err)
		if _, err := DecodeManifest(out); err != nil {
			t.Fatalf("re-encoded manifest refused: %v", err)
		}
		for _, e := range m.Entries {
			if p := filepath.Join("/ws", e.Path); !strings.HasPrefix(p, "/ws/") {
				t.Fatalf("%q resolves to %q", e.Path, p)
			}
		}
	})
}
