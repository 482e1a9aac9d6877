package containerd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrDigestMismatch reports content whose digest is not the one a Run is
// pinned to: a mislabelled archive, or a reference naming another digest.
var ErrDigestMismatch = errors.New("image digest does not match the pinned digest")

// Image sources reported in noderuntime.ImageResult.
const (
	sourceLocal    = "local"
	sourceArchive  = "archive"
	sourceRegistry = "registry"
)

// EnsureImage makes the build for spec.Platform of the image pinned by
// spec.ManifestDigest present (from containerd, else an archive in
// ImageDir, else a registry pull) under the name spec.Reference, and
// unpacks it when asked. Of a multi-platform index only that build is
// fetched; an image without it is noderuntime.ErrPlatformNotInImage. Each
// success marks the image used now.
func (r *Runtime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	ctx = r.ctx(ctx)
	res, err := r.ensureImage(ctx, spec)
	if err == nil {
		r.markUsed(ctx, digest.Digest(spec.ManifestDigest))
	}
	return res, err
}

func (r *Runtime) ensureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	want, err := digest.Parse(spec.ManifestDigest)
	if err != nil {
		return noderuntime.ImageResult{}, fmt.Errorf("ensure image %q: invalid manifest digest %q: %w", spec.Reference, spec.ManifestDigest, err)
	}
	if err := checkReference(spec.Reference, want); err != nil {
		return noderuntime.ImageResult{}, err
	}
	name := spec.Reference
	if name == "" {
		name = want.String()
	}
	log := r.log.With(zap.String("image", name))

	// Concurrent Runs of one image import it once; the rest see it present.
	unlock, err := r.imageLocks.LockContext(ctx, want.String())
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	defer unlock()

	img, found, err := r.findImage(ctx, want, name, spec.Platform)
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	if found {
		if img.Name != name {
			if img, err = r.nameImage(ctx, name, img.Target); err != nil {
				return noderuntime.ImageResult{}, err
			}
		}
		if err := r.unpackIfAsked(ctx, img, spec); err != nil {
			return noderuntime.ImageResult{}, err
		}
		return noderuntime.ImageResult{AlreadyPresent: true, Source: sourceLocal}, nil
	}

	archivePath, found, err := r.findArchive(ctx, want)
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	if found {
		img, size, err := r.importArchive(ctx, archivePath, want, name, spec)
		if err != nil {
			return noderuntime.ImageResult{}, err
		}
		if err := r.unpackIfAsked(ctx, img, spec); err != nil {
			return noderuntime.ImageResult{}, err
		}
		log.Info("imported image archive", zap.String("archive", archivePath), zap.Int64("bytes", size))
		return noderuntime.ImageResult{Source: sourceArchive, FetchedBytes: size}, nil
	}

	if spec.Reference == "" {
		return noderuntime.ImageResult{}, fmt.Errorf("%w: %s is neither in containerd nor in image dir %q, and no reference to pull was given",
			noderuntime.ErrImageNotFound, want, r.imageDir)
	}
	fetched, err := r.pull(ctx, spec, want)
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	log.Info("pulled image", zap.Int64("bytes", fetched), zap.String("platform", platformName(spec.Platform)))
	return noderuntime.ImageResult{Source: sourceRegistry, FetchedBytes: fetched}, nil
}

// checkReference refuses a name@digest reference whose digest is not want.
func checkReference(ref string, want digest.Digest) error {
	i := strings.LastIndex(ref, "@")
	if i < 0 {
		return nil
	}
	if got := ref[i+1:]; got != want.String() {
		return fmt.Errorf("%w: reference %s pins %s, the run pins %s", ErrDigestMismatch, ref, got, want)
	}
	return nil
}

// findImage returns an image record targeting want whose content for
// platform p is all present, preferring the one called name. A record whose
// image has no build for p is ErrPlatformNotInImage: the digest pins the
// content, so no source can have that build.
func (r *Runtime) findImage(ctx context.Context, want digest.Digest, name string, p *schemas.Platform) (images.Image, bool, error) {
	recs, err := r.client.ImageService().List(ctx, "target.digest=="+want.String())
	if err != nil {
		return images.Image{}, false, fmt.Errorf("list images with digest %s: %w", want, err)
	}
	var best images.Image
	found := false
	for _, rec := range recs {
		complete, err := r.complete(ctx, rec.Target, p)
		if err != nil {
			return images.Image{}, false, err
		}
		if !complete {
			continue
		}
		if !found || rec.Name == name {
			best, found = rec, true
		}
	}
	return best, found, nil
}

// complete says whether the manifest, config and layers of p's build are
// all in the content store. A record alone can outlive its content.
func (r *Runtime) complete(ctx context.Context, target ocispec.Descriptor, p *schemas.Platform) (bool, error) {
	cs := r.client.ContentStore()
	if _, err := buildFor(ctx, cs, target, p); errdefs.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	available, _, _, missing, err := images.Check(ctx, cs, target, platformMatcher(p))
	if err != nil {
		return false, fmt.Errorf("check content of %s: %w", target.Digest, err)
	}
	return available && len(missing) == 0, nil
}

// nameImage points the record called name at target, creating it if needed.
func (r *Runtime) nameImage(ctx context.Context, name string, target ocispec.Descriptor) (images.Image, error) {
	is := r.client.ImageService()
	rec := images.Image{Name: name, Target: target}
	img, err := is.Update(ctx, rec, "target")
	if errdefs.IsNotFound(err) {
		img, err = is.Create(ctx, rec)
		if errdefs.IsAlreadyExists(err) { // lost a race with another namer
			img, err = is.Update(ctx, rec, "target")
		}
	}
	if err != nil {
		return images.Image{}, fmt.Errorf("name image %s: %w", name, err)
	}
	return img, nil
}

func (r *Runtime) unpackIfAsked(ctx context.Context, rec images.Image, spec noderuntime.ImageSpec) error {
	if !spec.Unpack {
		return nil
	}
	img := ctrd.NewImageWithPlatform(r.client, rec, platformMatcher(spec.Platform))
	return r.unpack(ctx, img)
}

// unpack makes the image's layers available in the snapshotter.
func (r *Runtime) unpack(ctx context.Context, img ctrd.Image) error {
	ok, err := img.IsUnpacked(ctx, r.snapshotter)
	if err != nil {
		return fmt.Errorf("check unpacked %s: %w", img.Name(), err)
	}
	if ok {
		return nil
	}
	if err := img.Unpack(ctx, r.snapshotter); err != nil {
		return fmt.Errorf("unpack %s into %s: %w", img.Name(), r.snapshotter, err)
	}
	return nil
}

// pull fetches p's build from the reference's registry, counting bytes it
// had to download (content already present is not fetched again). Of an
// index, containerd fetches the one manifest the matcher picks first and
// only its config and layers.
func (r *Runtime) pull(ctx context.Context, spec noderuntime.ImageSpec, want digest.Digest) (int64, error) {
	// Our own lease keeps what the pull fetched (the index above all) until
	// it is checked below, whether or not containerd named an image.
	ctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return 0, fmt.Errorf("lease for pull: %w", err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	cs := r.client.ContentStore()
	// Whether a record already carried this name: only one this pull made
	// is removed below.
	_, err = r.client.ImageService().Get(ctx, spec.Reference)
	named := !errdefs.IsNotFound(err)
	var fetched atomic.Int64
	count := images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		// Runs before the fetch handler, so absent content is about to be downloaded.
		if _, err := cs.Info(ctx, desc.Digest); errdefs.IsNotFound(err) {
			fetched.Add(desc.Size)
		}
		return nil, nil
	})
	ref, err := schemas.ParseImageRef("reference", spec.Reference)
	if err != nil {
		return 0, fmt.Errorf("pull %s: %w", spec.Reference, err)
	}
	resolver, auth := r.resolver(ctx, spec, ref)
	opts := []ctrd.RemoteOpt{
		ctrd.WithResolver(resolver),
		ctrd.WithImageHandler(count),
		ctrd.WithPlatformMatcher(platformMatcher(spec.Platform)),
		ctrd.WithPullSnapshotter(r.snapshotter),
	}
	if spec.Unpack {
		opts = append(opts, ctrd.WithPullUnpack)
	}
	if spec.Progress != nil {
		var p pullProgress
		opts = append(opts, ctrd.WithImageHandlerWrapper(p.wrap(cs)))
		pctx, stop := context.WithCancel(ctx)
		polled := make(chan struct{})
		go func() { defer close(polled); p.poll(pctx, cs, 250*time.Millisecond, spec.Progress) }()
		defer func() { stop(); <-polled }()
	}
	img, err := r.client.Pull(ctx, spec.Reference, opts...)
	// An index without p's build pulls as the index alone (or fails to
	// unpack): say so, and leave no record naming it.
	if target, ok := storedDescriptor(ctx, cs, want); ok {
		if _, berr := buildFor(ctx, cs, target, spec.Platform); errors.Is(berr, noderuntime.ErrPlatformNotInImage) {
			if !named {
				_ = r.client.ImageService().Delete(ctx, spec.Reference)
			}
			return 0, berr
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("pull %s: %w", spec.Reference, ctx.Err())
		}
		if err := auth.authFailure(err, spec.Reference); errors.Is(err, noderuntime.ErrRegistryAuth) {
			return 0, err
		}
		// The error carries the registry's answer but never a credential:
		// the authorizer sends it in a header the client does not log.
		return 0, fmt.Errorf("%w: %s is neither in containerd nor in image dir %q, and pulling it failed: %w",
			noderuntime.ErrImageNotFound, spec.Reference, r.imageDir, err)
	}
	if got := img.Target().Digest; got != want {
		_ = r.client.ImageService().Delete(ctx, img.Name())
		return 0, fmt.Errorf("%w: registry served %s for %s, the run pins %s", ErrDigestMismatch, got, spec.Reference, want)
	}
	return fetched.Load(), nil
}
