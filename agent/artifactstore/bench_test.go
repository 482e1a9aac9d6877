package artifactstore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
)

// BenchmarkEnsureObject fetches one object from an embedded nats-server
// into the store, beside the baseline: nats.go's ObjectStore.GetFile of
// the same object into a file (what `nats object get` does). Size with
// WF_BENCH_MIB (default 256).
func BenchmarkEnsureObject(b *testing.B) {
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("WF_BENCH_MIB")); err == nil && v > 0 {
		mib = v
	}
	js, obs := startJS(b)
	data, digest := content(b, mib<<20)
	putObject(b, obs, "m", data)
	data = nil
	ctx := context.Background()

	b.Run("baseline-GetFile", func(b *testing.B) {
		b.SetBytes(int64(mib) << 20)
		dir := b.TempDir()
		for i := range b.N {
			if err := obs.GetFile(ctx, "m", filepath.Join(dir, strconv.Itoa(i))); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = os.Remove(filepath.Join(dir, strconv.Itoa(i)))
			b.StartTimer()
		}
	})
	b.Run("store-Ensure", func(b *testing.B) {
		b.SetBytes(int64(mib) << 20)
		s := newStore(b)
		w := Want{Digest: digest, SizeBytes: int64(mib) << 20, Source: OwnObjectReads(js, bus.ObjectBucketArtifacts, "m", digest)}
		for range b.N {
			res, err := s.Ensure(ctx, w)
			if err != nil || res.FetchedBytes != w.SizeBytes {
				b.Fatalf("%+v %v", res, err)
			}
			b.StopTimer()
			if err := s.Remove(digest); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}
