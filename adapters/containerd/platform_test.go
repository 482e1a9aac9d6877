package containerd

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// foreignPlatform is a platform this host is not, with a variant, so that
// normalization is exercised: linux/arm64/v8, or linux/amd64 on arm64.
func foreignPlatform() schemas.Platform {
	if runtime.GOARCH == "arm64" {
		return schemas.Platform{OS: "linux", Architecture: "amd64"}
	}
	return schemas.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
}

// twoBuilds is a multi-platform image: the host's build and a foreign one,
// each with /etc/build saying which it is (so their layers differ too).
type twoBuilds struct {
	host, foreign         testenv.Image
	hostRead, foreignRead builtImage
}

func buildTwo(t *testing.T, dir, name string) twoBuilds {
	t.Helper()
	var b twoBuilds
	b.host = testenv.BuildBusyboxImage(t, dir, name+"-host", testenv.WithFile("/etc/build", name+" host"))
	b.foreign = testenv.BuildBusyboxImage(t, dir, name+"-foreign", testenv.WithFile("/etc/build", name+" foreign"), testenv.WithPlatform(foreignPlatform()))
	b.hostRead, b.foreignRead = readArchive(t, b.host), readArchive(t, b.foreign)
	if b.foreignRead.config.Architecture != foreignPlatform().Architecture {
		t.Fatalf("foreign build's config is for %s", b.foreignRead.config.Architecture)
	}
	return b
}

// blobs are a build's manifest, config and layers.
func (a builtImage) blobs() []digest.Digest {
	out := []digest.Digest{a.mdesc.Digest, a.manifest.Config.Digest}
	for _, l := range a.manifest.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// requireContent fails unless each blob's presence in the content store is
// want.
func (f *fixture) requireContent(t *testing.T, what string, blobs []digest.Digest, want bool) {
	t.Helper()
	ctx := f.rt.ctx(testCtx(t))
	for _, d := range blobs {
		_, err := f.rt.client.ContentStore().Info(ctx, d)
		switch {
		case err == nil && !want:
			t.Errorf("%s: blob %s is in the content store; it must not have been fetched", what, d)
		case errdefs.IsNotFound(err) && want:
			t.Errorf("%s: blob %s is not in the content store", what, d)
		case err != nil && !errdefs.IsNotFound(err):
			t.Fatalf("%s: content info %s: %v", what, d, err)
		}
	}
}

// requireBuild checks what Images says of an index held as build a.
func (f *fixture) requireBuild(t *testing.T, indexDigest string, a builtImage) {
	t.Helper()
	got := f.imageByDigest(t, indexDigest)
	want := schemas.Platform{OS: a.config.OS, Architecture: a.config.Architecture, Variant: a.config.Variant}
	if !got.Index || got.Platform != want || got.State != schemas.LocalityHot || !got.ContentPresent {
		t.Fatalf("locality of index %s: %+v; want index, platform %s, hot with its content present", indexDigest, got, want)
	}
	if len(got.LayerDigests) != len(a.manifest.Layers) || got.LayerDigests[0] != a.manifest.Layers[0].Digest.String() {
		t.Fatalf("locality names layers %v, want the %s build's %v", got.LayerDigests, want, a.manifest.Layers)
	}
}

// catBuild launches digest's build for p, prints /etc/build and returns it.
func (f *fixture) catBuild(t *testing.T, id, ref, dgst string, p *schemas.Platform) (string, error) {
	t.Helper()
	_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: id, ImageReference: ref, ManifestDigest: dgst, Platform: p, Command: []string{"cat", "/etc/build"}})
	if err != nil {
		return "", err
	}
	t.Cleanup(func() {
		if err := f.rt.Remove(context.Background(), id); err != nil {
			t.Errorf("Remove %s: %v", id, err)
		}
	})
	if st := wait(t, f.rt, id); st.ExitCode != 0 {
		t.Fatalf("%s exited %d", id, st.ExitCode)
	}
	if err := f.rt.Finish(testCtx(t), id); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(nodelog.DataPath(f.rt.OutputDir(id), nodelog.Stdout))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), nil
}

func pinnedDigest(ref string) string { return ref[strings.LastIndex(ref, "@")+1:] }

func (f *fixture) testPlatforms(t *testing.T) {
	// Anonymous: credentials are another test's business.
	reg := testenv.StartRegistry(t, testenv.WithoutAuth())

	t.Run("PullsOnlyItsOwnBuild", func(t *testing.T) {
		t.Parallel()
		b := buildTwo(t, t.TempDir(), "own")
		ref := reg.PushIndex(t, "own", b.host, b.foreign)
		res, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: ref, ManifestDigest: pinnedDigest(ref), Unpack: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Source != sourceRegistry {
			t.Fatalf("EnsureImage = %+v, want a pull", res)
		}
		f.requireContent(t, "host build", b.hostRead.blobs(), true)
		f.requireContent(t, "foreign build", b.foreignRead.blobs(), false)
		f.requireBuild(t, pinnedDigest(ref), b.hostRead)
		if out, err := f.catBuild(t, "own-host", ref, pinnedDigest(ref), nil); err != nil || out != "own host" {
			t.Fatalf("launch without a platform printed %q (%v), want the host build's", out, err)
		}
	})

	t.Run("PullsAndRunsTheNamedBuild", func(t *testing.T) {
		t.Parallel()
		b := buildTwo(t, t.TempDir(), "named")
		ref := reg.PushIndex(t, "named", b.host, b.foreign)
		foreign := foreignPlatform()
		if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: ref, ManifestDigest: pinnedDigest(ref), Platform: &foreign, Unpack: true}); err != nil {
			t.Fatal(err)
		}
		f.requireContent(t, "foreign build", b.foreignRead.blobs(), true)
		f.requireContent(t, "host build", b.hostRead.blobs(), false)
		// What is here is the foreign build, whole: not a partial host one.
		f.requireBuild(t, pinnedDigest(ref), b.foreignRead)

		// The content is the host's busybox, so the named build can run
		// here, and the file says which build did.
		if out, err := f.catBuild(t, "named-foreign", ref, pinnedDigest(ref), &foreign); err != nil || out != "named foreign" {
			t.Fatalf("launch for %s printed %q (%v), want the foreign build's", foreign, out, err)
		}
		// Without a platform the host's build is meant, and it is not here.
		_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "named-host", ImageReference: ref, ManifestDigest: pinnedDigest(ref), Command: []string{"true"}})
		requireIs(t, err, noderuntime.ErrImageNotFound)
	})

	t.Run("AbsentPlatformIsCoded", func(t *testing.T) {
		t.Parallel()
		b := buildTwo(t, t.TempDir(), "absent")
		ref := reg.PushIndex(t, "absent", b.host, b.foreign)
		absent := schemas.Platform{OS: "linux", Architecture: "s390x"}
		if runtime.GOARCH == "s390x" {
			absent.Architecture = "ppc64le"
		}
		_, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: ref, ManifestDigest: pinnedDigest(ref), Platform: &absent, Unpack: true})
		requireIs(t, err, noderuntime.ErrPlatformNotInImage)
		for _, s := range []string{"linux/" + runtime.GOARCH, foreignPlatform().OS + "/" + foreignPlatform().Architecture, "not linux/" + absent.Architecture} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		if _, err := f.rt.client.ImageService().Get(f.rt.ctx(testCtx(t)), ref); !errdefs.IsNotFound(err) {
			t.Errorf("an image record names the index without the build (err %v)", err)
		}
		f.requireContent(t, "host build", b.hostRead.blobs(), false)
		f.requireContent(t, "foreign build", b.foreignRead.blobs(), false)

		// A single-platform image is that platform's build only, whether
		// it is here already (the fixture image) or not.
		foreign := foreignPlatform()
		_, err = f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: f.image.Reference, ManifestDigest: f.image.ManifestDigest, Platform: &foreign, Unpack: true})
		requireIs(t, err, noderuntime.ErrPlatformNotInImage)
		_, err = f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "absent-single", ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest, Platform: &foreign, Command: []string{"true"}})
		requireIs(t, err, noderuntime.ErrPlatformNotInImage)
		// The host's own platform, named, is the build already here.
		host := hostPlatform()
		if _, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: f.image.Reference, ManifestDigest: f.image.ManifestDigest, Platform: &host}); err != nil {
			t.Fatalf("EnsureImage for the host's platform %s, named: %v", host, err)
		}
	})

	t.Run("ArchiveKeepsOneBuild", func(t *testing.T) {
		t.Parallel()
		b := buildTwo(t, t.TempDir(), "archived")
		idx := writeIndexArchive(t, f.imageDir, b)
		ref := "localhost/archived@" + idx.String()
		res, err := f.rt.EnsureImage(testCtx(t), noderuntime.ImageSpec{Reference: ref, ManifestDigest: idx.String(), Unpack: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Source != sourceArchive {
			t.Fatalf("EnsureImage = %+v, want an import", res)
		}
		f.requireContent(t, "host build", b.hostRead.blobs(), true)
		// The archive held both builds; the other one is collected.
		f.requireContent(t, "foreign build", b.foreignRead.blobs(), false)
		f.requireBuild(t, idx.String(), b.hostRead)
	})
}

// writeIndexArchive writes one OCI image-layout archive holding both
// builds under an image index, named <index hex>.tar in dir.
func writeIndexArchive(t *testing.T, dir string, b twoBuilds) digest.Digest {
	t.Helper()
	files := map[string][]byte{}
	for _, img := range []testenv.Image{b.host, b.foreign} {
		f, err := os.Open(img.ArchivePath)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if name := path.Clean(h.Name); strings.HasPrefix(name, "blobs/") && h.Typeflag == tar.TypeReg {
				if files[name], err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
		}
		f.Close()
	}
	var manifests []ocispec.Descriptor
	for _, a := range []builtImage{b.hostRead, b.foreignRead} {
		d := a.mdesc
		d.Annotations = nil
		d.Platform = &ocispec.Platform{OS: a.config.OS, Architecture: a.config.Architecture, Variant: a.config.Variant}
		manifests = append(manifests, d)
	}
	index, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: manifests})
	if err != nil {
		t.Fatal(err)
	}
	idx := digest.FromBytes(index)
	files["blobs/sha256/"+idx.Encoded()] = index
	top, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageIndex, Digest: idx, Size: int64(len(index))}}})
	if err != nil {
		t.Fatal(err)
	}
	files["index.json"] = top
	files["oci-layout"] = []byte(`{"imageLayoutVersion":"1.0.0"}`)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, idx.Encoded()+".tar"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return idx
}
