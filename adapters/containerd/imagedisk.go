package containerd

import (
	"context"
	"fmt"
	"sort"

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
// and Launch of it (imageStore.markUsed): disk collection removes least
// recently used images first, and a label in containerd's metadata
// survives agent restarts.
const labelImageLastUsed = labelPrefix + "last-used"

// usage reports each image's bytes on disk (content for this host's
// platform, plus its unpacked layers) and its last use.
func (inv *inventory) usage(ctx context.Context) ([]noderuntime.ImageUse, error) {
	recs, err := inv.client.ImageService().List(ctx)
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
		fp, err := inv.footprint(ctx, rec.Target)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("image usage: %w", ctx.Err())
			}
			// One unreadable image must not hide the others; its size is
			// what could be read.
			inv.log.Warn("image usage partly unknown", zap.String("image", rec.Name), zap.Error(err))
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
func (inv *inventory) footprint(ctx context.Context, target ocispec.Descriptor) (footprint, error) {
	fp := footprint{blobs: map[digest.Digest]int64{}, snapshots: map[string]int64{}}
	cs := inv.client.ContentStore()
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
	chains, err := inv.chainIDs(ctx, cs, target)
	if err != nil || len(chains) == 0 {
		return fp, err
	}
	sn := inv.client.SnapshotService(inv.snapshotter)
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
func (inv *inventory) chainIDs(ctx context.Context, cs content.Store, target ocispec.Descriptor) ([]digest.Digest, error) {
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

// otherChains are the snapshot keys of every image but skip.
func (inv *inventory) otherChains(ctx context.Context, skip digest.Digest) (map[string]bool, error) {
	recs, err := inv.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	cs := inv.client.ContentStore()
	out := map[string]bool{}
	for _, rec := range recs {
		if rec.Target.Digest == skip {
			continue
		}
		chains, err := inv.chainIDs(ctx, cs, rec.Target)
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
func (inv *inventory) gone(ctx context.Context, fp footprint) int64 {
	var freed int64
	cs := inv.client.ContentStore()
	for d, size := range fp.blobs {
		if ok, err := has(ctx, cs, d); err == nil && !ok {
			freed += size
		}
	}
	sn := inv.client.SnapshotService(inv.snapshotter)
	for k, size := range fp.snapshots {
		if _, err := sn.Stat(ctx, k); errdefs.IsNotFound(err) {
			freed += size
		}
	}
	return freed
}
