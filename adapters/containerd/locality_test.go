package containerd

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

func (f *fixture) testImages(t *testing.T) {
	t.Run("ImportedIsHot", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		// A second name for the same image must not make a second entry.
		if _, err := nameImage(f.rt.ctx(ctx), f.rt.client.ImageService(), "localhost/second-name:latest", f.manifestDesc(t)); err != nil {
			t.Fatal(err)
		}
		want := expectedLocality(t, f.image)
		want.State, want.ContentPresent = schemas.LocalityHot, true
		got := f.imageByDigest(t, f.image.ManifestDigest)
		requireLocality(t, got, want)
	})

	t.Run("ImportedNotUnpackedIsPartial", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, f.imageDir, "packed", testenv.WithFile("/etc/variant", "packed"))
		f.ensure(t, img, false)
		want := expectedLocality(t, img)
		want.State, want.ContentPresent = schemas.LocalityPartial, true
		requireLocality(t, f.imageByDigest(t, img.ManifestDigest), want)
	})

	t.Run("SnapshotsRemovedNotHot", func(t *testing.T) {
		t.Parallel()
		img := testenv.BuildBusyboxImage(t, f.imageDir, "unhot", testenv.WithFile("/etc/variant", "unhot"))
		f.ensure(t, img, true)
		want := expectedLocality(t, img)
		want.State, want.ContentPresent = schemas.LocalityHot, true
		requireLocality(t, f.imageByDigest(t, img.ManifestDigest), want)

		// One layer: its chain ID is its diff ID.
		ctx := f.rt.ctx(testCtx(t))
		if err := f.rt.client.SnapshotService(f.rt.snapshotter).Remove(ctx, want.LayerDiffIDs[0]); err != nil {
			t.Fatalf("remove snapshot: %v", err)
		}
		want.State = schemas.LocalityPartial // every byte still here, nothing assembled
		requireLocality(t, f.imageByDigest(t, img.ManifestDigest), want)

		if err := f.rt.client.ContentStore().Delete(ctx, f.layerDesc(t, img).Digest); err != nil {
			t.Fatalf("delete layer blob: %v", err)
		}
		want.State, want.ContentPresent = schemas.LocalityCold, false
		requireLocality(t, f.imageByDigest(t, img.ManifestDigest), want)
	})

	t.Run("IndexDigestIsIdentity", func(t *testing.T) {
		t.Parallel()
		host := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
		foreign := ocispec.Platform{OS: "linux", Architecture: "s390x"}
		if runtime.GOARCH == "s390x" {
			foreign.Architecture = "ppc64le"
		}
		hostIdx := f.storeIndex(t, "localhost/multi:host", host)
		foreignIdx := f.storeIndex(t, "localhost/multi:foreign", foreign)

		want := expectedLocality(t, f.image)
		want.ManifestDigest, want.Index, want.State, want.ContentPresent = hostIdx.String(), true, schemas.LocalityHot, true
		requireLocality(t, f.imageByDigest(t, hostIdx.String()), want)

		// The same name's other build: this host holds none of its bytes.
		got := f.imageByDigest(t, foreignIdx.String())
		if got.State != schemas.LocalityCold || got.ContentPresent || len(got.LayerDigests) != 0 {
			t.Fatalf("foreign-platform index: %+v, want cold with nothing present", got)
		}
	})
}

// ensure imports img, unpacking it when asked.
func (f *fixture) ensure(t *testing.T, img testenv.Image, unpack bool) {
	t.Helper()
	if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: unpack}); err != nil {
		t.Fatalf("EnsureImage: %v", err)
	}
}

// imageByDigest returns the one Images entry for digest.
func (f *fixture) imageByDigest(t *testing.T, dgst string) schemas.ImageLocality {
	t.Helper()
	all, err := f.rt.Images(testCtx(t))
	if err != nil {
		t.Fatalf("Images: %v", err)
	}
	var found []schemas.ImageLocality
	for _, im := range all {
		if im.ManifestDigest == dgst {
			found = append(found, im)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Images holds %d entries for %s, want 1: %+v", len(found), dgst, all)
	}
	if !slices.IsSortedFunc(all, func(a, b schemas.ImageLocality) int { return strings.Compare(a.ManifestDigest, b.ManifestDigest) }) {
		t.Errorf("Images not sorted by digest")
	}
	return found[0]
}

func requireLocality(t *testing.T, got, want schemas.ImageLocality) {
	t.Helper()
	if time.Since(got.LastVerifiedAt) > time.Minute || got.LastVerifiedAt.After(time.Now()) {
		t.Errorf("LastVerifiedAt %v is not now", got.LastVerifiedAt)
	}
	got.LastVerifiedAt = time.Time{}
	b1, _ := json.Marshal(got)
	b2, _ := json.Marshal(want)
	if !bytes.Equal(b1, b2) {
		t.Fatalf("image locality\n got %s\nwant %s", b1, b2)
	}
}

// archive is an OCI image-layout tar read back, to check Images against
// what the builder wrote rather than against what containerd says.
type builtImage struct {
	manifest ocispec.Manifest
	config   ocispec.Image
	mdesc    ocispec.Descriptor
}

func readArchive(t *testing.T, img testenv.Image) builtImage {
	t.Helper()
	f, err := os.Open(img.ArchivePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[path.Clean(h.Name)] = b
	}
	blob := func(d ocispec.Descriptor, v any) {
		t.Helper()
		b, ok := files[path.Join("blobs", d.Digest.Algorithm().String(), d.Digest.Encoded())]
		if !ok {
			t.Fatalf("archive lacks blob %s", d.Digest)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	var idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("archive index.json: %v, %d manifests", err, len(idx.Manifests))
	}
	var a builtImage
	a.mdesc = idx.Manifests[0]
	blob(a.mdesc, &a.manifest)
	blob(a.manifest.Config, &a.config)
	return a
}

// expectedLocality is what Images must say of img, apart from State and
// ContentPresent.
func expectedLocality(t *testing.T, img testenv.Image) schemas.ImageLocality {
	t.Helper()
	a := readArchive(t, img)
	want := schemas.ImageLocality{ManifestDigest: img.ManifestDigest,
		Platform: schemas.Platform{OS: a.config.OS, Architecture: a.config.Architecture, Variant: a.config.Variant}}
	for _, l := range a.manifest.Layers {
		want.LayerDigests = append(want.LayerDigests, l.Digest.String())
		want.LayerSizes = append(want.LayerSizes, l.Size)
	}
	for _, d := range a.config.RootFS.DiffIDs {
		want.LayerDiffIDs = append(want.LayerDiffIDs, d.String())
	}
	if len(want.LayerDigests) == 0 || len(want.LayerDiffIDs) != len(want.LayerDigests) || want.Platform.OS != "linux" {
		t.Fatalf("built image reads back oddly: %+v", want)
	}
	return want
}

func (f *fixture) manifestDesc(t *testing.T) ocispec.Descriptor {
	t.Helper()
	return readArchive(t, f.image).mdesc
}

func (f *fixture) layerDesc(t *testing.T, img testenv.Image) ocispec.Descriptor {
	t.Helper()
	return readArchive(t, img).manifest.Layers[0]
}

// storeIndex writes an image index naming the fixture image's manifest as
// the build for platform, and names an image record after it.
func (f *fixture) storeIndex(t *testing.T, name string, platform ocispec.Platform) digest.Digest {
	t.Helper()
	ctx, done, err := f.rt.client.WithLease(f.rt.ctx(testCtx(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	m := f.manifestDesc(t)
	m.Platform = &platform
	b, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{m}})
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, f.rt.client.ContentStore(), "index-"+desc.Digest.Encoded(), bytes.NewReader(b), desc); err != nil {
		t.Fatalf("write index: %v", err)
	}
	if _, err := f.rt.client.ImageService().Create(ctx, images.Image{Name: name, Target: desc}); err != nil {
		t.Fatalf("create image %s: %v", name, err)
	}
	return desc.Digest
}
