package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// errNoBuild marks an index that lists no build a matcher accepts. It is
// also a NotFound, which is how locality reads it: nothing usable is here.
var errNoBuild = errors.New("no build for the platform")

// gcRefContent prefixes the labels by which containerd's garbage collector
// keeps a blob's children.
const gcRefContent = "containerd.io/gc.ref.content."

// platformMatcher is what a spec's platform selects: exactly that build
// (normalized, so arm64 is arm64/v8, and no lesser variant: the Run named
// it), or, when none is named, the host's own in containerd's order.
func platformMatcher(p *schemas.Platform) platforms.MatchComparer {
	if p == nil {
		return platforms.Default()
	}
	return platforms.OnlyStrict(ociPlatform(*p))
}

// platformName is how an error names a spec's platform.
func platformName(p *schemas.Platform) string {
	if p == nil {
		return platforms.DefaultString()
	}
	return platforms.Format(platforms.Normalize(ociPlatform(*p)))
}

// hostPlatform is the build this runtime picks when none is named.
func hostPlatform() schemas.Platform {
	return platformOf(platforms.DefaultSpec())
}

func ociPlatform(p schemas.Platform) ocispec.Platform {
	return ocispec.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}

func platformOf(p ocispec.Platform) schemas.Platform {
	return schemas.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}
}

// buildFor returns the manifest of target's build for spec platform p: the
// best match m accepts in an index (nested at most maxIndexDepth deep), or
// target itself when it is one manifest whose config is of a platform m
// accepts. An image without that build is ErrPlatformNotInImage, saying
// which builds it has; a blob needed to tell that is missing is NotFound.
func buildFor(ctx context.Context, cs content.Store, target ocispec.Descriptor, p *schemas.Platform) (ocispec.Descriptor, error) {
	m := platformMatcher(p)
	mdesc, err := resolveManifest(ctx, cs, target, m, false, maxIndexDepth)
	if errors.Is(err, errNoBuild) {
		return ocispec.Descriptor{}, fmt.Errorf("%w: index %s has builds for %s, not %s; name one of those as the Run's platform, or use an image built for %s",
			noderuntime.ErrPlatformNotInImage, target.Digest, strings.Join(indexPlatforms(ctx, cs, target, maxIndexDepth), ", "), platformName(p), platformName(p))
	}
	if err != nil || mdesc.Digest != target.Digest {
		return mdesc, err
	}
	// One manifest: its config says what it was built for.
	var manifest ocispec.Manifest
	if err := readJSON(ctx, cs, target, &manifest); err != nil {
		return ocispec.Descriptor{}, err
	}
	var config ocispec.Image
	if err := readJSON(ctx, cs, manifest.Config, &config); err != nil {
		return ocispec.Descriptor{}, err
	}
	if config.OS != "" && !m.Match(platforms.Normalize(config.Platform)) {
		return ocispec.Descriptor{}, fmt.Errorf("%w: image %s is one build, for %s, not %s; name that platform or none, or use an image built for %s",
			noderuntime.ErrPlatformNotInImage, target.Digest, platforms.Format(platforms.Normalize(config.Platform)), platformName(p), platformName(p))
	}
	return mdesc, nil
}

// resolveManifest resolves target to one manifest: target itself, or a
// build listed in an index (nested at most depth deep), the best by m. With
// held, the builds this node holds come first, whatever the host's own
// platform is: those whose manifest is here and kept by the index's
// garbage-collection labels (a pull labels every child and fetches the one
// it picked; an import labels only the one it keeps). An index holding none
// falls back to m. An index with no candidate is errNoBuild.
func resolveManifest(ctx context.Context, cs content.Store, target ocispec.Descriptor, m platforms.MatchComparer, held bool, depth int) (ocispec.Descriptor, error) {
	switch {
	case images.IsManifestType(target.MediaType):
		return target, nil
	case !images.IsIndexType(target.MediaType):
		return ocispec.Descriptor{}, fmt.Errorf("%w: %s has media type %q", errUnverifiable, target.Digest, target.MediaType)
	case depth <= 0:
		return ocispec.Descriptor{}, fmt.Errorf("%w: indexes nested deeper than %d under %s", errUnverifiable, maxIndexDepth, target.Digest)
	}
	var idx ocispec.Index
	if err := readJSON(ctx, cs, target, &idx); err != nil {
		return ocispec.Descriptor{}, err
	}
	var fits []ocispec.Descriptor
	if held {
		refs, err := referencedChildren(ctx, cs, target.Digest)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		for _, d := range idx.Manifests {
			if !refs[d.Digest] {
				continue
			}
			// A pull labels every child it sees and fetches one.
			here, err := has(ctx, cs, d.Digest)
			if err != nil {
				return ocispec.Descriptor{}, err
			}
			if here {
				fits = append(fits, d)
			}
		}
	}
	if len(fits) == 0 {
		for _, d := range idx.Manifests {
			if d.Platform != nil && m.Match(*d.Platform) {
				fits = append(fits, d)
			}
		}
	}
	if len(fits) == 0 {
		return ocispec.Descriptor{}, fmt.Errorf("index %s: %w: %w", target.Digest, errNoBuild, errdefs.ErrNotFound)
	}
	// Builds m accepts first, in its order; a child without a platform last.
	sort.SliceStable(fits, func(i, j int) bool {
		pi, pj := fits[i].Platform, fits[j].Platform
		switch {
		case pi == nil:
			return false
		case pj == nil:
			return true
		}
		return m.Less(*pi, *pj)
	})
	return resolveManifest(ctx, cs, fits[0], m, held, depth-1)
}

// referencedChildren is the set of blobs d's garbage-collection labels
// keep.
func referencedChildren(ctx context.Context, cs content.Store, d digest.Digest) (map[digest.Digest]bool, error) {
	info, err := cs.Info(ctx, d)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("content info %s: %w", d, err)
	}
	refs := map[digest.Digest]bool{}
	for k, v := range info.Labels {
		if strings.HasPrefix(k, gcRefContent) {
			refs[digest.Digest(v)] = true
		}
	}
	return refs, nil
}

// indexPlatforms lists the platforms an index names, for an error message;
// what cannot be read is left out.
func indexPlatforms(ctx context.Context, cs content.Store, target ocispec.Descriptor, depth int) []string {
	var idx ocispec.Index
	if depth <= 0 || readJSON(ctx, cs, target, &idx) != nil {
		return nil
	}
	var out []string
	for _, d := range idx.Manifests {
		switch {
		case images.IsIndexType(d.MediaType):
			out = append(out, indexPlatforms(ctx, cs, d, depth-1)...)
		case d.Platform != nil:
			out = append(out, platforms.Format(platforms.Normalize(*d.Platform)))
		}
	}
	if len(out) == 0 {
		return []string{"no platform"}
	}
	sort.Strings(out)
	return out
}

// storedDescriptor describes blob d as the content store holds it, with the
// media type its JSON declares (an index by its manifests when it declares
// none); ok is false when it is not here or is not an image's JSON.
func storedDescriptor(ctx context.Context, cs content.Store, d digest.Digest) (ocispec.Descriptor, bool) {
	info, err := cs.Info(ctx, d)
	if err != nil {
		return ocispec.Descriptor{}, false
	}
	desc := ocispec.Descriptor{Digest: d, Size: info.Size}
	var probe struct {
		MediaType string            `json:"mediaType"`
		Manifests []json.RawMessage `json:"manifests"`
		Config    json.RawMessage   `json:"config"`
	}
	if err := readJSON(ctx, cs, desc, &probe); err != nil {
		return ocispec.Descriptor{}, false
	}
	switch {
	case probe.MediaType != "":
		desc.MediaType = probe.MediaType
	case probe.Manifests != nil:
		desc.MediaType = ocispec.MediaTypeImageIndex
	case probe.Config != nil:
		desc.MediaType = ocispec.MediaTypeImageManifest
	default:
		return ocispec.Descriptor{}, false
	}
	return desc, true
}
