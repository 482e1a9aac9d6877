package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startBucket starts an embedded nats-server with the topology (the
// checkpoint bucket among it) and returns its JetStream.
func startBucket(t testing.TB) jetstream.JetStream {
	t.Helper()
	return testenv.ProvisionedBus(t, t.Name()).JS
}

const testBucket = bus.ObjectBucketCheckpoints

func sessionStore(t testing.TB, js jetstream.JetStream, tenant, session string) *ObjectStore {
	t.Helper()
	b, err := OpenObjectBucket(ctxT(t), js, testBucket)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.Session(tenant, session)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeRandom writes size random bytes to p.
func writeRandom(t testing.TB, rng *rand.Rand, p string, size int) {
	t.Helper()
	var seed [32]byte
	for i := range 4 {
		v := rng.Uint64()
		for k := range 8 {
			seed[i*8+k] = byte(v >> (8 * k))
		}
	}
	b := make([]byte, size)
	_, _ = rand.NewChaCha8(seed).Read(b)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// treeEntry is what a restore must reproduce of one path.
type treeEntry struct {
	mode     fs.FileMode
	size     int64
	sum      string
	target   string
	mtime    int64
	uid, gid uint32
	isDir    bool
}

// tree reads dir as a map of relative path to what it is.
func tree(t testing.TB, dir string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		e := treeEntry{mode: info.Mode(), mtime: info.ModTime().UnixNano(), isDir: d.IsDir()}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			e.uid, e.gid = sys.Uid, sys.Gid
		}
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			e.size, e.sum = int64(len(b)), hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			e.target, _ = os.Readlink(p)
		case !d.IsDir():
			return nil // a fifo or socket: not checkpointed
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
