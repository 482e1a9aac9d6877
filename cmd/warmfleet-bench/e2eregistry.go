package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/internal/ociimage"
	"github.com/warmfleet/warmfleet/internal/registryproc"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// privateImage is a large image in a private registry on loopback: the
// bench's busybox plus random (incompressible, like model weights) layers,
// pushed to docker-registry behind htpasswd.
type privateImage struct {
	reg    *registryproc.Registry
	ref    schemas.ImageRef
	bytes  int64 // compressed layers, what a pull fetches
	source *registryauth.Source
}

// newPrivateImage starts the registry under dir, builds the image on base
// with layers random layers of mib/layers MiB each, pushes it, and writes
// the control plane's registry credentials file for it.
func newPrivateImage(ctx context.Context, dir string, base ociimage.Image, mib, layers int) (*privateImage, error) {
	pw, err := registryproc.RandomHex(16)
	if err != nil {
		return nil, err
	}
	reg, err := registryproc.Start(ctx, registryproc.Config{Dir: dir, User: "bench", Password: pw})
	if err != nil {
		return nil, err
	}
	p := &privateImage{reg: reg}
	img, err := registryproc.LoadArchive(base.ArchivePath, base.ManifestDigest, filepath.Join(dir, "base"))
	if err != nil {
		reg.Stop()
		return nil, err
	}
	seed := uint64(time.Now().UnixNano())
	for i := range layers {
		l, err := randomLayer(int64(mib)<<20/int64(layers), seed+uint64(i))
		if err != nil {
			reg.Stop()
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			reg.Stop()
			return nil, err
		}
	}
	m, err := img.Manifest()
	if err != nil {
		reg.Stop()
		return nil, err
	}
	for _, l := range m.Layers {
		p.bytes += l.Size
	}
	pinned, err := reg.Push(ctx, "bench/large", img)
	if err != nil {
		reg.Stop()
		return nil, err
	}
	if p.ref, err = schemas.ParseImageRef("image", pinned); err != nil {
		reg.Stop()
		return nil, err
	}
	// The control plane reads the credential as `serve --registry-auth`
	// does: from a Docker config.json.
	authPath := filepath.Join(dir, "registry-auth.json")
	auth := fmt.Sprintf(`{"auths": {%q: {"username": %q, "password": %q}}}`, reg.Host, reg.User, reg.Password)
	if err := os.WriteFile(authPath, []byte(auth), 0o600); err != nil {
		reg.Stop()
		return nil, err
	}
	file, err := registryauth.LoadConfig(authPath)
	if err != nil {
		reg.Stop()
		return nil, err
	}
	if p.source, err = registryauth.NewSource(file, nil, registryauth.HelperRunner{}); err != nil {
		reg.Stop()
		return nil, err
	}
	return p, nil
}

func (p *privateImage) stop() { p.reg.Stop() }

// credentials is what the direct baseline presents: the account itself,
// with no control plane to ask.
func (p *privateImage) credentials(context.Context, string) (noderuntime.RegistryCredential, error) {
	return noderuntime.RegistryCredential{Registry: p.reg.Host, Username: p.reg.User, Secret: p.reg.Password}, nil
}

// randomLayer is a gzip layer holding one file of n pseudo-random bytes,
// compressed once.
func randomLayer(n int64, seed uint64) (v1.Layer, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	if err := tw.WriteHeader(&tar.Header{Name: "weights/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("weights/shard-%016x.bin", seed), Typeflag: tar.TypeReg, Mode: 0o644, Size: n}); err != nil {
		return nil, err
	}
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24), byte(seed >> 32), byte(seed >> 40)})
	if _, err := io.CopyN(tw, rng, n); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	tarBytes := raw.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching, tarball.WithMediaType(types.OCILayer))
}

// imageRecorder is the agent's ImageMetrics in the bench: every credential
// ask and every fetch, in order.
type imageRecorder struct {
	mu          sync.Mutex
	credentials []time.Duration
	failedAsks  int
	fetches     []time.Duration
}

func (r *imageRecorder) CredentialAsked(d time.Duration, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !answered {
		r.failedAsks++
		return
	}
	r.credentials = append(r.credentials, d)
}

func (r *imageRecorder) ImageFetched(source string, _ int64, d time.Duration) {
	if source != "registry" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetches = append(r.fetches, d)
}

func (r *imageRecorder) snapshot() (creds, fetches []time.Duration, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.credentials...), append([]time.Duration(nil), r.fetches...), r.failedAsks
}

// dropImage deletes every record of the image pinned by dgst from each
// namespace and lets containerd's garbage collector free its content and
// snapshots before it returns, so the next pull is cold.
func dropImage(ctx context.Context, address string, dgst digest.Digest, nss ...string) error {
	client, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	type record struct{ ns, name string }
	var recs []record
	for _, ns := range nss {
		found, err := client.ImageService().List(namespaces.WithNamespace(ctx, ns), "target.digest=="+dgst.String())
		if err != nil {
			return err
		}
		for _, f := range found {
			recs = append(recs, record{ns, f.Name})
		}
	}
	for i, rec := range recs {
		var opts []images.DeleteOpt
		if i == len(recs)-1 { // the collection runs once, after the last
			opts = append(opts, images.SynchronousDelete())
		}
		if err := client.ImageService().Delete(namespaces.WithNamespace(ctx, rec.ns), rec.name, opts...); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	for _, ns := range nss {
		if _, err := client.ContentStore().Info(namespaces.WithNamespace(ctx, ns), dgst); err == nil {
			return fmt.Errorf("image %s survived its deletion in namespace %s: the next pull would not be cold", dgst, ns)
		}
	}
	return nil
}
