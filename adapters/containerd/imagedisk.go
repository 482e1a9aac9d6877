package containerd

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// labelImageLastUsed is set on every name of an image at each EnsureImage
// and Launch of it: disk collection removes least recently used images
// first, and a label in containerd's metadata survives agent restarts.
const labelImageLastUsed = labelPrefix + "last-used"

// markUsed records now as the image's last use on every record naming it.
// A failure is logged, not returned: the image is usable, and collection
// then falls back to when the record was last updated.
func (r *Runtime) markUsed(ctx context.Context, want digest.Digest) {
	is := r.client.ImageService()
	recs, err := is.List(ctx, "target.digest=="+want.String())
	if err != nil {
		r.log.Warn("mark image used", zap.Stringer("digest", want), zap.Error(err))
		return
	}
	now := formatTime(time.Now())
	for _, rec := range recs {
		rec.Labels = map[string]string{labelImageLastUsed: now}
		if _, err := is.Update(ctx, rec, "labels."+labelImageLastUsed); err != nil && !errdefs.IsNotFound(err) {
			r.log.Warn("mark image used", zap.String("image", rec.Name), zap.Error(err))
		}
	}
}

// ImageUsage reports each image's bytes on disk (content for this host's
// platform, plus its unpacked layers) and its last use.
func (r *Runtime) ImageUsage(ctx context.Context) ([]noderuntime.ImageUse, error) {
	ctx = r.ctx(ctx)
	recs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	byDigest := map[digest.Digest]*noderuntime.ImageUse{}
	for _, rec := range recs {
		last := parseTime(rec.Labels[labelImageLastUsed])
		if last.IsZero() {
			last = rec.UpdatedAt
		}
		if u, ok := byDigest[rec.Target.Digest]; ok {
			if last.After(u.LastUsedAt) {
				u.LastUsedAt = last
			}
			continue
		}
		fp, err := r.footprint(ctx, rec.Target)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("image usage: %w", ctx.Err())
			}
			// One unreadable image must not hide the others; its size is
			// what could be read.
			r.log.Warn("image usage partly unknown", zap.String("image", rec.Name), zap.Error(err))
		}
		byDigest[rec.Target.Digest] = &noderuntime.ImageUse{ManifestDigest: rec.Target.Digest.String(), SizeBytes: fp.bytes(), LastUsedAt: last}
	}
	out := make([]noderuntime.ImageUse, 0, len(byDigest))
	for _, u := range byDigest {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ManifestDigest < out[j].ManifestDigest })
	return out, nil
}

// footprint is what one image holds on disk: its blobs and its unpacked
// snapshots (by chain id), each with its size.
type footprint struct {
	blobs     map[digest.Digest]int64
	snapshots map[string]int64
	// chain is this host's build's snapshot keys, bottom layer first,
	// present or not.
	chain []string
}

func (f footprint) bytes() int64 {
	var n int64
	for _, s := range f.blobs {
		n += s
	}
	for _, s := range f.snapshots {
		n += s
	}
	return n
}

// footprint walks target (every manifest an index lists that is here) for
// its blobs, and this host's build's layer chain for its snapshots. What
// is absent is left out; an error still returns what was found.
func (r *Runtime) footprint(ctx context.Context, target ocispec.Descriptor) (footprint, error) {
	fp := footprint{blobs: map[digest.Digest]int64{}, snapshots: map[string]int64{}}
	cs := r.client.ContentStore()
	children := images.ChildrenHandler(cs)
	walk := images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		info, err := cs.Info(ctx, desc.Digest)
		if errdefs.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		fp.blobs[desc.Digest] = info.Size
		sub, err := children(ctx, desc)
		if errdefs.IsNotFound(err) {
			return nil, nil
		}
		return sub, err
	})
	if err := images.Walk(ctx, walk, target); err != nil {
		return fp, fmt.Errorf("walk image %s: %w", target.Digest, err)
	}
	chains, err := r.chainIDs(ctx, cs, target)
	if err != nil || len(chains) == 0 {
		return fp, err
	}
	sn := r.client.SnapshotService(r.snapshotter)
	for _, c := range chains {
		fp.chain = append(fp.chain, c.String())
		u, err := sn.Usage(ctx, c.String())
		switch {
		case errdefs.IsNotFound(err):
		case err != nil:
			return fp, fmt.Errorf("snapshot usage %s: %w", c, err)
		default:
			fp.snapshots[c.String()] = u.Size
		}
	}
	return fp, nil
}

// chainIDs are the snapshot keys of the build of target this node holds
// (as locality resolves it), bottom layer first; none when its manifest or
// config is not here.
func (r *Runtime) chainIDs(ctx context.Context, cs content.Store, target ocispec.Descriptor) ([]digest.Digest, error) {
	mdesc, err := resolveManifest(ctx, cs, target, platforms.Default(), true, maxIndexDepth)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var manifest ocispec.Manifest
	if err := readJSON(ctx, cs, mdesc, &manifest); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	var config ocispec.Image
	if err := readJSON(ctx, cs, manifest.Config, &config); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return identity.ChainIDs(append([]digest.Digest(nil), config.RootFS.DiffIDs...)), nil
}

// RemoveImage deletes every record naming the image, letting containerd's
// garbage collector take the content and snapshots nothing else references
// (the last delete waits for it), then removes what is left of its layer
// chain that no other image shares. It returns the bytes that are gone.
func (r *Runtime) RemoveImage(ctx context.Context, manifestDigest string) (noderuntime.RemovedImage, error) {
	ctx = r.ctx(ctx)
	want, err := digest.Parse(manifestDigest)
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image: invalid manifest digest %q: %w", manifestDigest, err)
	}
	// An EnsureImage of the same image waits, and then finds it gone.
	unlock, err := r.imageLocks.LockContext(ctx, want.String())
	if err != nil {
		return noderuntime.RemovedImage{}, err
	}
	defer unlock()

	is := r.client.ImageService()
	recs, err := is.List(ctx, "target.digest=="+want.String())
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: list: %w", want, err)
	}
	if len(recs) == 0 {
		return noderuntime.RemovedImage{}, nil
	}
	before, err := r.footprint(ctx, recs[0].Target)
	if err != nil {
		return noderuntime.RemovedImage{}, fmt.Errorf("remove image %s: %w", want, err)
	}
	shared, err := r.otherChains(ctx, want)
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
	sn := r.client.SnapshotService(r.snapshotter)
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
	return noderuntime.RemovedImage{Freed: r.gone(ctx, before)}, nil
}

// otherChains are the snapshot keys of every image but skip.
func (r *Runtime) otherChains(ctx context.Context, skip digest.Digest) (map[string]bool, error) {
	recs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	cs := r.client.ContentStore()
	out := map[string]bool{}
	for _, rec := range recs {
		if rec.Target.Digest == skip {
			continue
		}
		chains, err := r.chainIDs(ctx, cs, rec.Target)
		if err != nil {
			return nil, err
		}
		for _, c := range chains {
			out[c.String()] = true
		}
	}
	return out, nil
}

// gone adds up the blobs and snapshots of fp that are no longer here.
func (r *Runtime) gone(ctx context.Context, fp footprint) int64 {
	var freed int64
	cs := r.client.ContentStore()
	for d, size := range fp.blobs {
		if ok, err := has(ctx, cs, d); err == nil && !ok {
			freed += size
		}
	}
	sn := r.client.SnapshotService(r.snapshotter)
	for k, size := range fp.snapshots {
		if _, err := sn.Stat(ctx, k); errdefs.IsNotFound(err) {
			freed += size
		}
	}
	return freed
}
