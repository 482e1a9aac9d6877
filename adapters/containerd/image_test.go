package containerd

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

func (f *fixture) testEnsureImage(t *testing.T) {
	t.Run("ImportThenPresent", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, f.imageDir, "import", testenv.WithFile("/etc/variant", "import"))
		spec := noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}
		ctx := f.rt.ctx(testCtx(t))

		res, err := f.rt.EnsureImage(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		want := noderuntime.ImageResult{Source: "archive", FetchedBytes: img.SizeBytes}
		if res != want {
			t.Fatalf("first EnsureImage = %+v, want %+v", res, want)
		}
		rec, err := f.rt.client.ImageService().Get(ctx, img.Reference)
		if err != nil {
			t.Fatalf("image record named by reference: %v", err)
		}
		if rec.Target.Digest.String() != img.ManifestDigest {
			t.Fatalf("image target %s, want %s", rec.Target.Digest, img.ManifestDigest)
		}
		// Names carried inside the archive are not imported.
		if _, err := f.rt.client.ImageService().Get(ctx, "localhost/import:latest"); !errdefs.IsNotFound(err) {
			t.Fatalf("archive's own name was imported (err %v)", err)
		}

		res, err = f.rt.EnsureImage(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if want := (noderuntime.ImageResult{AlreadyPresent: true, Source: "local"}); res != want {
			t.Fatalf("second EnsureImage = %+v, want %+v", res, want)
		}
	})

	t.Run("ImportReportsProgress", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, f.imageDir, "progress", testenv.WithFile("/etc/variant", "progress"))
		var calls int
		var last, total int64
		spec := noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true,
			Progress: func(done, tot int64) {
				calls++
				if done < last {
					t.Errorf("progress went back from %d to %d bytes", last, done)
				}
				last, total = done, tot
			}}
		if _, err := f.rt.EnsureImage(testCtx(t), spec); err != nil {
			t.Fatal(err)
		}
		// The archive is read to its end, and its size is the total.
		if calls < 2 || last != img.SizeBytes || total != img.SizeBytes {
			t.Fatalf("progress: %d calls, last %d of %d, want ≥2 calls ending at %d of %d", calls, last, total, img.SizeBytes, img.SizeBytes)
		}
	})

	t.Run("PullReportsProgress", func(t *testing.T) {
		t.Parallel()
		// Built outside the image dir, so the registry is the only source.
		img := testenv.BuildBusyboxImage(t, t.TempDir(), "pulled", testenv.WithFile("/etc/variant", "pulled"))
		// Anonymous: this case is about progress; credentials have their own.
		reg := testenv.StartRegistry(t, testenv.WithBlobDelay(20*time.Millisecond), testenv.WithoutAuth())
		ref := reg.Push(t, "pulled", img)
		var mu sync.Mutex
		var calls int
		var last, total int64
		spec := noderuntime.ImageSpec{Reference: ref, ManifestDigest: img.ManifestDigest, Unpack: true,
			Progress: func(done, tot int64) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if done < last || done > tot {
					t.Errorf("progress %d of %d after %d", done, tot, last)
				}
				last, total = done, tot
			}}
		res, err := f.rt.EnsureImage(testCtx(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		if res.Source != "registry" || res.FetchedBytes <= 0 {
			t.Fatalf("EnsureImage = %+v, want a registry pull", res)
		}
		mu.Lock()
		defer mu.Unlock()
		if calls < 2 || total <= 0 || total > res.FetchedBytes {
			t.Fatalf("progress: %d calls, last %d of %d (fetched %d), want ≥2 calls with a known total", calls, last, total, res.FetchedBytes)
		}
	})

	t.Run("ConcurrentCallsImportOnce", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, f.imageDir, "concurrent", testenv.WithFile("/etc/variant", "concurrent"))
		spec := noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}
		results := make(chan noderuntime.ImageResult, 3)
		errs := make(chan error, 3)
		for range 3 {
			go func() {
				res, err := f.rt.EnsureImage(testCtx(t), spec)
				results <- res
				errs <- err
			}()
		}
		imports := 0
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			if res := <-results; !res.AlreadyPresent {
				imports++
			}
		}
		if imports != 1 {
			t.Fatalf("%d of 3 concurrent calls imported, want 1", imports)
		}
	})

	t.Run("PresentUnderAnotherName", func(t *testing.T) {
		t.Parallel()
		alias := "localhost/alias@" + f.image.ManifestDigest
		res, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: alias, ManifestDigest: f.image.ManifestDigest, Unpack: true})
		if err != nil {
			t.Fatal(err)
		}
		if !res.AlreadyPresent || res.Source != "local" || res.FetchedBytes != 0 {
			t.Fatalf("EnsureImage = %+v, want already present", res)
		}
		rec, err := f.rt.client.ImageService().Get(f.rt.ctx(testCtx(t)), alias)
		if err != nil || rec.Target.Digest.String() != f.image.ManifestDigest {
			t.Fatalf("alias record %+v, %v", rec, err)
		}
	})

	t.Run("ArchiveFoundByScan", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, t.TempDir(), "scan", testenv.WithFile("/etc/variant", "scan"))
		if err := os.Rename(img.ArchivePath, filepath.Join(f.imageDir, "some-name.tar")); err != nil {
			t.Fatal(err)
		}
		res, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest})
		if err != nil {
			t.Fatal(err)
		}
		if res.Source != "archive" || res.AlreadyPresent {
			t.Fatalf("EnsureImage = %+v, want an archive import", res)
		}
	})

	t.Run("MislabelledArchiveRefused", func(t *testing.T) {
		t.Parallel()
		other := digest.FromString("some other image")
		img := testenv.BuildBusyboxImage(t, t.TempDir(), "liar", testenv.WithFile("/etc/variant", "liar"))
		if err := os.Rename(img.ArchivePath, filepath.Join(f.imageDir, other.Encoded()+".tar")); err != nil {
			t.Fatal(err)
		}
		_, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: "localhost/liar@" + other.String(), ManifestDigest: other.String()})
		requireIs(t, err, ErrDigestMismatch)
		t.Log(err)
		recs, lerr := f.rt.client.ImageService().List(f.rt.ctx(testCtx(t)), "target.digest=="+img.ManifestDigest)
		if lerr != nil || len(recs) != 0 {
			t.Fatalf("refused archive left image records %v (err %v)", recs, lerr)
		}
	})

	t.Run("ReferencePinsOtherDigest", func(t *testing.T) {
		t.Parallel()
		other := digest.FromString("x")
		_, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: f.image.Reference, ManifestDigest: other.String()})
		requireIs(t, err, ErrDigestMismatch)
	})

	t.Run("NotFoundAnywhere", func(t *testing.T) {
		t.Parallel()
		missing := digest.FromString("nowhere")
		_, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: "localhost/nowhere@" + missing.String(), ManifestDigest: missing.String()})
		requireIs(t, err, noderuntime.ErrImageNotFound)
		t.Log(err)
	})

	t.Run("InvalidDigest", func(t *testing.T) {
		t.Parallel()
		if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: "x", ManifestDigest: "sha256:nothex"}); err == nil {
			t.Fatal("invalid digest accepted")
		}
	})
}
