package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/warmfleet/warmfleet/internal/registryproc"
)

// Registry is a real OCI distribution registry (Debian's docker-registry,
// internal/registryproc) serving plain HTTP on 127.0.0.1 with htpasswd
// basic auth, its storage in the test's temp dir. containerd treats
// loopback hosts as plain-HTTP registries, so a test pulls without TLS and
// without a network.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of a reference. With
	// WithBlobDelay it is the slowing proxy's address.
	Host string
	// User and Password are the one account htpasswd admits; empty with
	// WithoutAuth.
	User, Password string
	// Direct is the registry's own address, behind any proxy.
	Direct string

	r *registryproc.Registry
}

// RegistryOption varies StartRegistry.
type RegistryOption func(*registryproc.Config)

// WithBlobDelay puts a loopback proxy in front of the registry that writes
// blob bodies in 64 KiB chunks, d apart, so a pull lasts long enough to
// watch. Host is then the proxy's address.
func WithBlobDelay(d time.Duration) RegistryOption {
	return func(c *registryproc.Config) { c.BlobDelay = d }
}

// WithoutAuth serves anonymous pulls and pushes.
func WithoutAuth() RegistryOption {
	return func(c *registryproc.Config) { c.User, c.Password = "", "" }
}

// StartRegistry starts docker-registry on a free loopback port and stops it
// when the test ends. It skips t when the package is missing, and fails t
// instead when CI is set.
func StartRegistry(t testing.TB, opts ...RegistryOption) *Registry {
	t.Helper()
	pw, err := registryproc.RandomHex(12)
	if err != nil {
		t.Fatal(err)
	}
	cfg := registryproc.Config{Dir: t.TempDir(), User: "warmfleet", Password: "pw-" + pw}
	for _, o := range opts {
		o(&cfg)
	}
	r, err := registryproc.Start(context.Background(), cfg)
	if errors.Is(err, registryproc.ErrMissing) {
		unavailable(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(r.Stop)
	return &Registry{Host: r.Host, User: r.User, Password: r.Password, Direct: r.Direct, r: r}
}

// Push uploads an OCI archive image (BuildBusyboxImage) as repo and returns
// the reference a Run pins: "<Host>/<repo>@<manifest digest>".
func (r *Registry) Push(t testing.TB, repo string, img Image) string {
	t.Helper()
	ref, err := r.r.Push(context.Background(), repo, loadImage(t, img))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return ref
}

// PushIndex uploads a multi-platform index of single-platform images, each
// listed under the platform its config names, and returns the reference
// pinned to the index digest.
func (r *Registry) PushIndex(t testing.TB, repo string, imgs ...Image) string {
	t.Helper()
	var v1imgs []v1.Image
	for _, img := range imgs {
		v1imgs = append(v1imgs, loadImage(t, img))
	}
	ref, err := r.r.PushIndex(context.Background(), repo, v1imgs...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return ref
}

func loadImage(t testing.TB, img Image) v1.Image {
	t.Helper()
	v, err := registryproc.LoadArchive(img.ArchivePath, img.ManifestDigest, t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return v
}
