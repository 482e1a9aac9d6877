package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// errUnverifiable marks image content this adapter cannot classify (an
// unreadable or unknown blob): the image is reported unknown, never guessed.
var errUnverifiable = errors.New("image content cannot be verified")

// inventory reads what this node holds of each image, as verified now
// against the content store and the snapshotter Launch uses: where each
// image stands on the way to a start (its locality, here) and its bytes on
// disk (imagedisk.go). It changes nothing.
type inventory struct {
	client      *ctrd.Client
	snapshotter string
	log         *zap.Logger
}

// localities reports every image in this Runtime's namespace, once per
// target digest (several names may point at one image), sorted by digest.
func (inv *inventory) localities(ctx context.Context) ([]schemas.ImageLocality, error) {
	recs, err := inv.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	seen := make(map[digest.Digest]bool, len(recs))
	out := make([]schemas.ImageLocality, 0, len(recs))
	for _, rec := range recs {
		if seen[rec.Target.Digest] {
			continue
		}
		seen[rec.Target.Digest] = true
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
		loc, err := inv.locality(ctx, rec.Target)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("images: %w", ctx.Err())
			}
			// One unreadable image must not hide the others.
			inv.log.Warn("image locality unknown", zap.String("image", rec.Name), zap.Stringer("digest", rec.Target.Digest), zap.Error(err))
		}
		out = append(out, loc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ManifestDigest < out[j].ManifestDigest })
	return out, nil
}

// locality measures the build of one image this node holds. On error it still
// returns what it established, with State unknown.
func (inv *inventory) locality(ctx context.Context, target ocispec.Descriptor) (schemas.ImageLocality, error) {
	loc := schemas.ImageLocality{ManifestDigest: target.Digest.String(), State: schemas.LocalityUnknown, LastVerifiedAt: time.Now()}
	cs := inv.client.ContentStore()

	loc.Index = images.IsIndexType(target.MediaType)
	// An index names one image per platform; what is here is the build a
	// pull or import fetched, whichever platform that was.
	mdesc, err := resolveManifest(ctx, cs, target, platforms.Default(), true, maxIndexDepth)
	if errdefs.IsNotFound(err) {
		// The record is here but no build of it: a missing index or
		// manifest, or an index without this platform and nothing fetched.
		loc.State = schemas.LocalityCold
		return loc, nil
	}
	if err != nil {
		return loc, err
	}
	if mdesc.Platform != nil {
		loc.Platform = platformOf(*mdesc.Platform)
	}
	var manifest ocispec.Manifest
	if err := readJSON(ctx, cs, mdesc, &manifest); err != nil {
		if errdefs.IsNotFound(err) {
			loc.State = schemas.LocalityCold
			return loc, nil
		}
		return loc, err
	}
	for _, l := range manifest.Layers {
		loc.LayerDigests = append(loc.LayerDigests, l.Digest.String())
		loc.LayerSizes = append(loc.LayerSizes, l.Size)
	}

	var config ocispec.Image
	configHere := true
	if err := readJSON(ctx, cs, manifest.Config, &config); errdefs.IsNotFound(err) {
		configHere = false
	} else if err != nil {
		return loc, err
	} else {
		loc.Platform = platformOf(config.Platform)
		for _, d := range config.RootFS.DiffIDs {
			loc.LayerDiffIDs = append(loc.LayerDiffIDs, d.String())
		}
	}

	layersHere := 0
	for _, l := range manifest.Layers {
		ok, err := has(ctx, cs, l.Digest)
		if err != nil {
			return loc, err
		}
		if ok {
			layersHere++
		}
	}
	loc.ContentPresent = configHere && layersHere == len(manifest.Layers)

	unpacked := 0
	if configHere && len(config.RootFS.DiffIDs) > 0 {
		if unpacked, err = inv.unpackedLayers(ctx, config.RootFS.DiffIDs); err != nil {
			return loc, err
		}
	}
	switch {
	case configHere && unpacked == len(config.RootFS.DiffIDs) && unpacked > 0:
		loc.State = schemas.LocalityHot
	case unpacked > 0 || layersHere > 0:
		loc.State = schemas.LocalityPartial
	default:
		// A manifest and config alone are a name, not a start.
		loc.State = schemas.LocalityCold
	}
	return loc, nil
}

// unpackedLayers is how many leading layers of diffIDs are assembled in the
// snapshotter: a committed snapshot is keyed by the chain ID of its layer
// and every layer beneath it, so a chain's presence proves its prefix.
func (inv *inventory) unpackedLayers(ctx context.Context, diffIDs []digest.Digest) (int, error) {
	sn := inv.client.SnapshotService(inv.snapshotter)
	chains := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	for n := len(chains); n > 0; n-- {
		_, err := sn.Stat(ctx, chains[n-1].String())
		if err == nil {
			return n, nil
		}
		if !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("stat snapshot %s in %s: %w", chains[n-1], inv.snapshotter, err)
		}
	}
	return 0, nil
}

// readJSON reads a blob and decodes it; a missing blob is errdefs.ErrNotFound.
func readJSON(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, v any) error {
	p, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
		}
		return fmt.Errorf("read blob %s: %w", desc.Digest, err)
	}
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("%w: blob %s: %w", errUnverifiable, desc.Digest, err)
	}
	return nil
}

// has says whether the content store holds the blob.
func has(ctx context.Context, cs content.Store, d digest.Digest) (bool, error) {
	_, err := cs.Info(ctx, d)
	switch {
	case err == nil:
		return true, nil
	case errdefs.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("content info %s: %w", d, err)
	}
}
