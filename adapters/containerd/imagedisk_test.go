package containerd

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

func (f *fixture) testImageDisk(t *testing.T) {
	t.Run("UsageAndLastUse", func(t *testing.T) {
		t.Parallel()
		older := testenv.BuildBusyboxImage(t, f.imageDir, "lru-older", testenv.WithFile("/etc/variant", "lru-older"))
		newer := testenv.BuildBusyboxImage(t, f.imageDir, "lru-newer", testenv.WithFile("/etc/variant", "lru-newer"))
		f.ensure(t, older, true)
		f.ensure(t, newer, true)
		time.Sleep(10 * time.Millisecond)
		f.ensure(t, older, true) // an ensure of a present image is a use too
		use := f.usageByDigest(t)
		o, n := use[older.ManifestDigest], use[newer.ManifestDigest]
		if !o.LastUsedAt.After(n.LastUsedAt) {
			t.Fatalf("last used: older image %v, newer %v; the later ensure must make the older image the more recent", o.LastUsedAt, n.LastUsedAt)
		}
		// Content (the archive's blobs) plus the unpacked layer.
		if o.SizeBytes <= older.SizeBytes/2 || n.SizeBytes <= newer.SizeBytes/2 {
			t.Fatalf("sizes %d and %d; archives hold %d and %d", o.SizeBytes, n.SizeBytes, older.SizeBytes, newer.SizeBytes)
		}
	})

	t.Run("RemoveFreesContentAndSnapshots", func(t *testing.T) {
		t.Parallel()
		ctx := f.rt.ctx(testCtx(t))
		gone := testenv.BuildBusyboxImage(t, f.imageDir, "evicted", testenv.WithFile("/etc/variant", "evicted"))
		stays := testenv.BuildBusyboxImage(t, f.imageDir, "survivor", testenv.WithFile("/etc/variant", "survivor"))
		f.ensure(t, gone, true)
		f.ensure(t, stays, true)
		// A second name must go too.
		if _, err := nameImage(ctx, f.rt.client.ImageService(), "localhost/evicted-alias:latest", f.targetOf(t, gone)); err != nil {
			t.Fatal(err)
		}
		goneFP, err := f.rt.inventory.footprint(ctx, f.targetOf(t, gone))
		if err != nil {
			t.Fatal(err)
		}
		staysFP, err := f.rt.inventory.footprint(ctx, f.targetOf(t, stays))
		if err != nil {
			t.Fatal(err)
		}
		if len(goneFP.snapshots) == 0 || len(goneFP.blobs) < 3 {
			t.Fatalf("footprint before removal: %d blobs, %d snapshots; want manifest, config, layer and an unpacked layer", len(goneFP.blobs), len(goneFP.snapshots))
		}
		size := f.usageByDigest(t)[gone.ManifestDigest].SizeBytes

		res, err := f.rt.RemoveImage(testCtx(t), gone.ManifestDigest)
		if err != nil {
			t.Fatal(err)
		}
		if res.Freed != size {
			t.Errorf("freed %d bytes, want the image's whole usage %d (nothing of it is shared)", res.Freed, size)
		}
		if recs, err := f.rt.client.ImageService().List(ctx, "target.digest=="+gone.ManifestDigest); err != nil || len(recs) != 0 {
			t.Fatalf("image records left: %v (err %v)", recs, err)
		}
		// Content is gone from the store and from the daemon's disk.
		for d := range goneFP.blobs {
			if _, err := f.rt.client.ContentStore().Info(ctx, d); !errdefs.IsNotFound(err) {
				t.Errorf("blob %s still in the content store (err %v)", d, err)
			}
			if _, err := os.Stat(f.blobPath(d)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("blob file %s still on disk (err %v)", f.blobPath(d), err)
			}
		}
		sn := f.rt.client.SnapshotService(f.rt.snapshotter)
		for k := range goneFP.snapshots {
			if _, err := sn.Stat(ctx, k); !errdefs.IsNotFound(err) {
				t.Errorf("snapshot %s still there (err %v)", k, err)
			}
		}
		// The other image is untouched: still hot, nothing to fetch.
		for d := range staysFP.blobs {
			if _, err := f.rt.client.ContentStore().Info(ctx, d); err != nil {
				t.Errorf("the other image's blob %s: %v", d, err)
			}
		}
		for k := range staysFP.snapshots {
			if _, err := sn.Stat(ctx, k); err != nil {
				t.Errorf("the other image's snapshot %s: %v", k, err)
			}
		}
		all, err := f.rt.Images(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range all {
			if im.ManifestDigest == gone.ManifestDigest {
				t.Errorf("Images still lists the removed image: %+v", im)
			}
		}

		// Idempotent: a second removal has nothing to do.
		if res, err := f.rt.RemoveImage(testCtx(t), gone.ManifestDigest); err != nil || res.Freed != 0 {
			t.Fatalf("second RemoveImage = %+v, %v; want nothing freed, no error", res, err)
		}
		// And the image comes back from its archive when a Run needs it.
		res2, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: gone.Reference, ManifestDigest: gone.ManifestDigest, Unpack: true})
		if err != nil || res2.AlreadyPresent {
			t.Fatalf("EnsureImage after removal = %+v, %v; want a fresh import", res2, err)
		}
	})

	t.Run("RemoveKeepsSharedLayers", func(t *testing.T) {
		t.Parallel()
		ctx := f.rt.ctx(testCtx(t))
		img := testenv.BuildBusyboxImage(t, f.imageDir, "shared", testenv.WithFile("/etc/variant", "shared"))
		f.ensure(t, img, true)
		// A second image (another manifest digest) over the same layer: an
		// index wrapping the manifest.
		idx := f.indexOver(t, img)
		fp, err := f.rt.inventory.footprint(ctx, f.targetOf(t, img))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.rt.RemoveImage(testCtx(t), img.ManifestDigest); err != nil {
			t.Fatal(err)
		}
		sn := f.rt.client.SnapshotService(f.rt.snapshotter)
		for k := range fp.snapshots {
			if _, err := sn.Stat(ctx, k); err != nil {
				t.Errorf("snapshot %s the index still uses was removed: %v", k, err)
			}
		}
		for d := range fp.blobs {
			if _, err := f.rt.client.ContentStore().Info(ctx, d); err != nil {
				t.Errorf("blob %s the index still uses was removed: %v", d, err)
			}
		}
		if _, err := f.rt.RemoveImage(testCtx(t), idx.String()); err != nil {
			t.Fatal(err)
		}
		for k := range fp.snapshots {
			if _, err := sn.Stat(ctx, k); !errdefs.IsNotFound(err) {
				t.Errorf("snapshot %s left after the last image over it went (err %v)", k, err)
			}
		}
	})
}

func (f *fixture) usageByDigest(t *testing.T) map[string]noderuntime.ImageUse {
	t.Helper()
	all, err := f.rt.ImageUsage(testCtx(t))
	if err != nil {
		t.Fatalf("ImageUsage: %v", err)
	}
	out := map[string]noderuntime.ImageUse{}
	for _, u := range all {
		out[u.ManifestDigest] = u
	}
	return out
}

func (f *fixture) blobPath(d digest.Digest) string {
	return filepath.Join(f.env.Root, "io.containerd.content.v1.content", "blobs", d.Algorithm().String(), d.Encoded())
}

// targetOf is the descriptor img's record points at.
func (f *fixture) targetOf(t *testing.T, img testenv.Image) ocispec.Descriptor {
	t.Helper()
	rec, err := f.rt.client.ImageService().Get(f.rt.ctx(testCtx(t)), img.Reference)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Target
}

// indexOver makes a second image over img's content: an archive whose
// index.json names an index listing img's manifest as the host's build,
// imported as any archive is. It returns the index's digest.
func (f *fixture) indexOver(t *testing.T, img testenv.Image) digest.Digest {
	t.Helper()
	m := readArchive(t, img).mdesc
	p := platforms.DefaultSpec()
	m.Platform, m.Annotations = &p, nil
	b, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{m}})
	if err != nil {
		t.Fatal(err)
	}
	idx := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(b), Size: int64(len(b))}
	top, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{idx}})
	if err != nil {
		t.Fatal(err)
	}

	// img's archive, its index.json replaced, the new index added.
	src, err := os.Open(img.ArchivePath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(name string, body []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	tr := tar.NewReader(src)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || h.Name == "index.json" {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		add(h.Name, body)
	}
	add("blobs/sha256/"+idx.Digest.Encoded(), b)
	add("index.json", top)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.imageDir, idx.Digest.Encoded()+".tar"), out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := "localhost/index-over@" + idx.Digest.String()
	if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: ref, ManifestDigest: idx.Digest.String(), Unpack: true}); err != nil {
		t.Fatalf("import the index over %s: %v", img.Reference, err)
	}
	return idx.Digest
}
