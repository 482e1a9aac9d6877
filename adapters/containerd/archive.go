package containerd

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/images/archive"
	"github.com/containerd/containerd/leases"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// maxIndexDepth bounds the search through nested indexes of an archive
// (index.json -> image index -> platform manifest is depth 2).
const maxIndexDepth = 3

// importLeaseExpiry bounds how long an import's blobs outlive an agent that
// died mid-import (containerd's own default for a client lease).
const importLeaseExpiry = 24 * time.Hour

// archiveDir is the directory of OCI image archives EnsureImage imports
// from before it tries a registry.
type archiveDir struct {
	dir    string // "" disables archives
	client *ctrd.Client
	log    *zap.Logger
}

// find returns the archive in the directory that should hold want:
// <hex>.tar when it exists, else the first *.tar whose blobs include want.
func (a archiveDir) find(ctx context.Context, want digest.Digest) (string, bool, error) {
	if a.dir == "" {
		return "", false, nil
	}
	named := filepath.Join(a.dir, want.Encoded()+".tar")
	if _, err := os.Stat(named); err == nil {
		return named, true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("image archive %s: %w", named, err)
	}
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("read image dir: %w", err)
	}
	blobName := path.Join("blobs", want.Algorithm().String(), want.Encoded())
	for _, e := range entries {
		// Dot files are partial writes by convention; skip them.
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		if err := ctx.Err(); err != nil {
			return "", false, err
		}
		p := filepath.Join(a.dir, e.Name())
		ok, err := archiveHasEntry(p, blobName)
		if err != nil {
			a.log.Warn("skipping unreadable image archive", zap.String("archive", p), zap.Error(err))
			continue
		}
		if ok {
			return p, true, nil
		}
	}
	return "", false, nil
}

// archiveHasEntry lists a tar's headers (tar.Reader seeks over bodies of a
// file, so this is cheap) looking for name. The entry's path only makes the
// archive a candidate; the import verifies content by digest.
func archiveHasEntry(p, name string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if path.Clean(h.Name) == name {
			return true, nil
		}
	}
}

// importImage loads an OCI (or Docker) archive into the content store and
// names only the image whose digest is want: names the archive itself
// carries are ignored, so importing cannot retarget other images. Of an
// index only spec.Platform's build is kept: the rest of the archive is
// referenced by nothing once the import's lease ends, and that lease's
// deletion collects it before this returns.
func (a archiveDir) importImage(ctx context.Context, p string, want digest.Digest, name string, spec noderuntime.ImageSpec) (images.Image, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return images.Image{}, 0, fmt.Errorf("open image archive: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return images.Image{}, 0, fmt.Errorf("stat image archive: %w", err)
	}

	// The lease keeps imported blobs from garbage collection until the
	// image record references them.
	ls := a.client.LeasesService()
	lease, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(importLeaseExpiry))
	if err != nil {
		return images.Image{}, 0, fmt.Errorf("lease for import: %w", err)
	}
	ctx = leases.WithLease(ctx, lease.ID)
	defer func() {
		if err := ls.Delete(context.WithoutCancel(ctx), lease, leases.SynchronousDelete); err != nil {
			a.log.Warn("end import lease", zap.String("archive", p), zap.Error(err))
		}
	}()

	cs := a.client.ContentStore()
	var src io.Reader = f
	if spec.Progress != nil {
		src = &countingReader{r: f, total: st.Size(), fn: spec.Progress}
	}
	index, err := archive.ImportIndex(ctx, cs, src)
	if err != nil {
		return images.Image{}, 0, fmt.Errorf("import image archive %s: %w", p, err)
	}
	// The store is content-addressed, so finding want here proves the
	// archive's bytes hash to the pinned digest.
	target, held, err := findDescriptor(ctx, cs, index, want, maxIndexDepth)
	if err != nil {
		return images.Image{}, 0, fmt.Errorf("read index of image archive %s: %w", p, err)
	}
	if target == nil {
		return images.Image{}, 0, fmt.Errorf("%w: archive %s does not hold %s; its index lists %s",
			ErrDigestMismatch, p, want, strings.Join(held, ", "))
	}

	if _, err := buildFor(ctx, cs, *target, spec.Platform); err != nil {
		if errdefs.IsNotFound(err) {
			return images.Image{}, 0, fmt.Errorf("image archive %s is incomplete for %s: %w", p, want, err)
		}
		return images.Image{}, 0, err
	}
	// Label (keep) one build, the one a pull of the same index would fetch.
	m := platformMatcher(spec.Platform)
	handler := images.SetChildrenLabels(cs, images.LimitManifests(images.FilterPlatforms(images.ChildrenHandler(cs), m), m, 1))
	if err := images.Walk(ctx, handler, *target); err != nil {
		if errdefs.IsNotFound(err) {
			return images.Image{}, 0, fmt.Errorf("image archive %s is incomplete for %s: %w", p, want, err)
		}
		return images.Image{}, 0, fmt.Errorf("label content of %s: %w", want, err)
	}
	complete, err := complete(ctx, cs, *target, spec.Platform)
	if err != nil {
		return images.Image{}, 0, err
	}
	if !complete {
		return images.Image{}, 0, fmt.Errorf("image archive %s lacks layers of %s for %s", p, want, platformName(spec.Platform))
	}
	img, err := nameImage(ctx, a.client.ImageService(), name, *target)
	if err != nil {
		return images.Image{}, 0, err
	}
	return img, st.Size(), nil
}

// findDescriptor searches an index and the indexes nested in it for want,
// returning its descriptor and, for error messages, the digests it saw.
func findDescriptor(ctx context.Context, cs content.Provider, index ocispec.Descriptor, want digest.Digest, depth int) (*ocispec.Descriptor, []string, error) {
	p, err := content.ReadBlob(ctx, cs, index)
	if err != nil {
		return nil, nil, err
	}
	var idx ocispec.Index
	if err := json.Unmarshal(p, &idx); err != nil {
		return nil, nil, fmt.Errorf("parse index %s: %w", index.Digest, err)
	}
	var held []string
	for _, m := range idx.Manifests {
		held = append(held, m.Digest.String())
		if m.Digest == want {
			d := m
			return &d, nil, nil
		}
	}
	if depth > 1 {
		for _, m := range idx.Manifests {
			if !images.IsIndexType(m.MediaType) {
				continue
			}
			d, sub, err := findDescriptor(ctx, cs, m, want, depth-1)
			if err != nil {
				return nil, nil, err
			}
			if d != nil {
				return d, nil, nil
			}
			held = append(held, sub...)
		}
	}
	sort.Strings(held)
	return nil, held, nil
}
