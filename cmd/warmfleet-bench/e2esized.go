package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/internal/ociimage"
	"github.com/warmfleet/warmfleet/internal/registryproc"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// sizedOpts shape the production-sized cases.
type sizedOpts struct {
	runs        int
	imageMiB    int
	layers      int
	baseLayers  int
	artifactMiB int
	links       string
	cases       []string // of warm, partial, cold; empty is all three
}

// sizedCases are the production-sized cases, in the order they run.
var sizedCases = []string{"warm", "partial", "cold"}

// has reports whether case name is to be measured.
func (o sizedOpts) has(name string) bool {
	return len(o.cases) == 0 || slices.Contains(o.cases, name)
}

func (o sizedOpts) check() error {
	switch {
	case o.layers < 1 || o.baseLayers < 0 || o.baseLayers >= o.layers:
		return fmt.Errorf("--image-layers %d, --base-layers %d: want at least one layer of the variant's own", o.layers, o.baseLayers)
	case o.imageMiB < o.layers:
		return fmt.Errorf("--image-mib %d over %d layers: at least 1 MiB a layer", o.imageMiB, o.layers)
	case o.artifactMiB < 1:
		return fmt.Errorf("--artifact-mib %d: must be positive", o.artifactMiB)
	}
	for _, c := range o.cases {
		if !slices.Contains(sizedCases, c) {
			return fmt.Errorf("--cases %q: want some of %s", c, strings.Join(sizedCases, ","))
		}
	}
	_, err := parseLinks(o.links)
	return err
}

// sizedRef is one image of the family as each side names it: the agent
// through the shaped link, the direct floor at the registry itself (the
// bytes the floor needs are already on the machine, see runSized).
type sizedRef struct {
	via, direct schemas.ImageRef
	img         familyImage
}

// sizedWorld is the private registry holding the image family, the link
// between the node and its sources, and the credential the control plane
// hands out for the registry (under both of its names).
type sizedWorld struct {
	reg    *registryproc.Registry
	link   *shapedLink
	regVia string
	fam    *imageFamily
	// a is the image every warm and cold Run names; b shares a's base.
	a, b   sizedRef
	source *registryauth.Source
}

func newSizedWorld(ctx context.Context, dir string, busybox ociimage.Image, o sizedOpts, link *shapedLink) (*sizedWorld, error) {
	pw, err := registryproc.RandomHex(16)
	if err != nil {
		return nil, err
	}
	reg, err := registryproc.Start(ctx, registryproc.Config{Dir: dir, User: "bench", Password: pw})
	if err != nil {
		return nil, err
	}
	w := &sizedWorld{reg: reg, link: link}
	if err := w.build(ctx, dir, busybox, o); err != nil {
		reg.Stop()
		return nil, err
	}
	return w, nil
}

func (w *sizedWorld) build(ctx context.Context, dir string, busybox ociimage.Image, o sizedOpts) error {
	var err error
	if w.regVia, err = w.link.proxy(w.reg.Host); err != nil {
		return err
	}
	root, err := registryproc.LoadArchive(busybox.ArchivePath, busybox.ManifestDigest, filepath.Join(dir, "busybox"))
	if err != nil {
		return err
	}
	layersDir := filepath.Join(dir, "layers")
	if err := os.MkdirAll(layersDir, 0o700); err != nil {
		return err
	}
	layerBytes := int64(o.imageMiB) << 20 / int64(o.layers)
	if w.fam, err = buildImageFamily(ctx, layersDir, root, layerBytes, o.baseLayers, o.layers-o.baseLayers, 2, rand.Uint64()>>1); err != nil {
		return fmt.Errorf("build images: %w", err)
	}
	for i, dst := range []*sizedRef{&w.a, &w.b} {
		v := w.fam.variants[i]
		pinned, err := w.reg.Push(ctx, "bench/sized", v.img)
		if err != nil {
			return fmt.Errorf("push: %w", err)
		}
		if dst.direct, err = schemas.ParseImageRef("image", pinned); err != nil {
			return err
		}
		if dst.via, err = schemas.ParseImageRef("image", w.regVia+strings.TrimPrefix(pinned, w.reg.Host)); err != nil {
			return err
		}
		dst.img = v
	}
	// The control plane reads the account as `serve --registry-auth` does.
	authPath := filepath.Join(dir, "registry-auth.json")
	entry := map[string]string{"username": w.reg.User, "password": w.reg.Password}
	auth, err := json.Marshal(map[string]any{"auths": map[string]any{w.reg.Host: entry, w.regVia: entry}})
	if err != nil {
		return err
	}
	if err := os.WriteFile(authPath, auth, 0o600); err != nil {
		return err
	}
	file, err := registryauth.LoadConfig(authPath)
	if err != nil {
		return err
	}
	w.source, err = registryauth.NewSource(file, nil, registryauth.HelperRunner{})
	return err
}

func (w *sizedWorld) stop() { w.reg.Stop() }

// credentials is what the direct floor presents: the account itself.
func (w *sizedWorld) credentials(context.Context, string) (noderuntime.RegistryCredential, error) {
	return noderuntime.RegistryCredential{Registry: w.reg.Host, Username: w.reg.User, Secret: w.reg.Password}, nil
}

func (w *sizedWorld) directSpec(r sizedRef) noderuntime.ImageSpec {
	return noderuntime.ImageSpec{Reference: r.direct.String(), ManifestDigest: r.direct.Digest, Unpack: true, Credentials: w.credentials}
}

// rawBlobs is the transfer floor for blobs: each fetched through the link
// with a plain HTTP GET (basic auth, as the registry's htpasswd takes) and
// discarded. It returns the bytes moved.
func (w *sizedWorld) rawBlobs(ctx context.Context, blobs []familyLayer) (int64, error) {
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	var total int64
	for _, b := range blobs {
		u := url.URL{Scheme: "http", Host: w.regVia, Path: "/v2/bench/sized/blobs/" + b.digest.String()}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return total, err
		}
		req.SetBasicAuth(w.reg.User, w.reg.Password)
		resp, err := client.Do(req)
		if err != nil {
			return total, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		total += n
		if err != nil {
			return total, err
		}
		if resp.StatusCode != http.StatusOK {
			return total, fmt.Errorf("raw GET of %s: %s", b.digest, resp.Status)
		}
	}
	return total, nil
}
