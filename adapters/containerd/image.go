package containerd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/internal/keyed"
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

// imageStore puts the images workloads run into containerd and finds them
// there: from containerd itself, else an archive in the image directory,
// else a registry. It also takes them out again (RemoveImage). Its lock
// keeps an ensure and a removal of one image from overlapping.
type imageStore struct {
	client      *ctrd.Client
	snapshotter string
	archives    archiveDir
	registry    *registry
	inventory   *inventory  // what a removal frees
	locks       keyed.Mutex // by image digest
	log         *zap.Logger
}

// ensure is Runtime.EnsureImage: each success marks the image used now.
func (s *imageStore) ensure(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	res, err := s.obtain(ctx, spec)
	if err == nil {
		s.markUsed(ctx, digest.Digest(spec.ManifestDigest))
	}
	return res, err
}

// obtain finds the image in containerd, else imports it from an archive,
// else pulls it, under the image's lock, which it takes.
func (s *imageStore) obtain(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
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
	log := s.log.With(zap.String("image", name))

	// Concurrent Runs of one image import it once; the rest see it present.
	unlock, err := s.locks.LockContext(ctx, want.String())
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	defer unlock()

	img, found, err := s.find(ctx, want, name, spec.Platform)
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	if found {
		if img.Name != name {
			if img, err = nameImage(ctx, s.client.ImageService(), name, img.Target); err != nil {
				return noderuntime.ImageResult{}, err
			}
		}
		if err := s.unpackIfAsked(ctx, img, spec); err != nil {
			return noderuntime.ImageResult{}, err
		}
		return noderuntime.ImageResult{AlreadyPresent: true, Source: sourceLocal}, nil
	}

	archivePath, found, err := s.archives.find(ctx, want)
	if err != nil {
		return noderuntime.ImageResult{}, err
	}
	if found {
		img, size, err := s.archives.importImage(ctx, archivePath, want, name, spec)
		if err != nil {
			return noderuntime.ImageResult{}, err
		}
		if err := s.unpackIfAsked(ctx, img, spec); err != nil {
			return noderuntime.ImageResult{}, err
		}
		log.Info("imported image archive", zap.String("archive", archivePath), zap.Int64("bytes", size))
		return noderuntime.ImageResult{Source: sourceArchive, FetchedBytes: size}, nil
	}

	if spec.Reference == "" {
		return noderuntime.ImageResult{}, fmt.Errorf("%w: %s is neither in containerd nor in image dir %q, and no reference to pull was given",
			noderuntime.ErrImageNotFound, want, s.archives.dir)
	}
	fetched, err := s.registry.pull(ctx, spec, want)
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

// find returns an image record targeting want whose content for
// platform p is all present, preferring the one called name. A record whose
// image has no build for p is ErrPlatformNotInImage: the digest pins the
// content, so no source can have that build.
func (s *imageStore) find(ctx context.Context, want digest.Digest, name string, p *schemas.Platform) (images.Image, bool, error) {
	recs, err := s.client.ImageService().List(ctx, "target.digest=="+want.String())
	if err != nil {
		return images.Image{}, false, fmt.Errorf("list images with digest %s: %w", want, err)
	}
	cs := s.client.ContentStore()
	var best images.Image
	found := false
	for _, rec := range recs {
		complete, err := complete(ctx, cs, rec.Target, p)
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
func complete(ctx context.Context, cs content.Store, target ocispec.Descriptor, p *schemas.Platform) (bool, error) {
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
func nameImage(ctx context.Context, is images.Store, name string, target ocispec.Descriptor) (images.Image, error) {
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

func (s *imageStore) unpackIfAsked(ctx context.Context, rec images.Image, spec noderuntime.ImageSpec) error {
	if !spec.Unpack {
		return nil
	}
	img := ctrd.NewImageWithPlatform(s.client, rec, platformMatcher(spec.Platform))
	return s.unpack(ctx, img)
}

// unpack makes the image's layers available in the snapshotter.
func (s *imageStore) unpack(ctx context.Context, img ctrd.Image) error {
	ok, err := img.IsUnpacked(ctx, s.snapshotter)
	if err != nil {
		return fmt.Errorf("check unpacked %s: %w", img.Name(), err)
	}
	if ok {
		return nil
	}
	if err := img.Unpack(ctx, s.snapshotter); err != nil {
		return fmt.Errorf("unpack %s into %s: %w", img.Name(), s.snapshotter, err)
	}
	return nil
}

// forLaunch finds the pinned image in containerd and makes sure it is
// unpacked. It does not fetch: that is ensure's job.
func (s *imageStore) forLaunch(ctx context.Context, spec noderuntime.WorkloadSpec) (ctrd.Image, error) {
	want, err := digest.Parse(spec.ManifestDigest)
	if err != nil {
		return nil, fmt.Errorf("invalid manifest digest %q: %w", spec.ManifestDigest, err)
	}
	rec, found, err := s.find(ctx, want, spec.ImageReference, spec.Platform)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: %s (%s) is not in containerd; EnsureImage first", noderuntime.ErrImageNotFound, spec.ImageReference, want)
	}
	// The platform names which build of an index runs; a single manifest
	// of another platform was refused by find.
	img := ctrd.NewImageWithPlatform(s.client, rec, platformMatcher(spec.Platform))
	if err := s.unpack(ctx, img); err != nil {
		return nil, err
	}
	return img, nil
}

// markUsed records now as the image's last use on every record naming it.
// A failure is logged, not returned: the image is usable, and collection
// then falls back to when the record was last updated.
func (s *imageStore) markUsed(ctx context.Context, want digest.Digest) {
	is := s.client.ImageService()
	recs, err := is.List(ctx, "target.digest=="+want.String())
	if err != nil {
		s.log.Warn("mark image used", zap.Stringer("digest", want), zap.Error(err))
		return
	}
	now := formatTime(time.Now())
	for _, rec := range recs {
		rec.Labels = map[string]string{labelImageLastUsed: now}
		if _, err := is.Update(ctx, rec, "labels."+labelImageLastUsed); err != nil && !errdefs.IsNotFound(err) {
			s.log.Warn("mark image used", zap.String("image", rec.Name), zap.Error(err))
		}
	}
}

// remove deletes every record naming the image, letting containerd's
// garbage collector take the content and snapshots nothing else references
// (the last delete waits for it), then removes what is left of its layer
// chain that no other image shares. It returns the bytes that are gone.
func (s *imageStore) remove(ctx context.Context, manifestDigest string) (noderuntime.RemovedImage, error) {
	want, err := digest.Parse(manifestDigest)
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image: invalid manifest digest %q: %w", manifestDigest, err)
	}
	// An ensure of the same image waits, and then finds it gone.
	unlock, err := s.locks.LockContext(ctx, want.String())
	if err != nil {
		return noderuntime.RemovedImage{}, err
	}
	defer unlock()

	is := s.client.ImageService()
	recs, err := is.List(ctx, "target.digest=="+want.String())
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: list: %w", want, err)
	}
	if len(recs) == 0 {
		return noderuntime.RemovedImage{}, nil
	}
	before, err := s.inventory.footprint(ctx, recs[0].Target)
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: %w", want, err)
	}
	shared, err := s.inventory.otherChains(ctx, want)
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: %w", want, err)
	}
	for i, rec := range recs {
		var opts []images.DeleteOpt
		if i == len(recs)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		if err := is.Delete(ctx, rec.Name, opts...); err != nil && !errdefs.IsNotFound(err) {
			return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: delete %s: %w", want, rec.Name, err)
		}
	}
	// The collector takes an unpacked chain with its config; a snapshot it
	// left (one a lease or an interrupted unpack held) goes here, top
	// first, stopping at one that still has children.
	chains := before.chain
	sn := s.client.SnapshotService(s.snapshotter)
	for i := len(chains) - 1; i >= 0; i-- {
		if shared[chains[i]] {
			break
		}
		if err := sn.Remove(ctx, chains[i]); err != nil && !errdefs.IsNotFound(err) {
			if errdefs.IsFailedPrecondition(err) {
				break // a container's or another image's layer sits on it
			}
			return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: snapshot %s: %w", want, chains[i], err)
		}
	}
	return noderuntime.RemovedImage{Freed: s.inventory.gone(ctx, before)}, nil
}
