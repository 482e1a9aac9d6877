package containerd

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// testRegistryAuth pulls from a registry that demands a login (htpasswd
// basic auth): the Credentials callback is asked only when the registry
// challenges, the right credential pulls, and a missing, wrong or
// unobtainable one fails with ErrRegistryAuth naming the registry and
// never the secret.
func (f *fixture) testRegistryAuth(t *testing.T) {
	t.Parallel()
	reg := testenv.StartRegistry(t)
	push := func(name string) (noderuntime.ImageSpec, testenv.Image) {
		img := testenv.BuildBusyboxImage(t, t.TempDir(), name, testenv.WithFile("/etc/variant", name))
		return noderuntime.ImageSpec{Reference: reg.Push(t, "private/"+name, img), ManifestDigest: img.ManifestDigest, Unpack: true}, img
	}
	var asked atomic.Int64
	answer := func(c noderuntime.RegistryCredential, err error) func(context.Context, string) (noderuntime.RegistryCredential, error) {
		return func(_ context.Context, host string) (noderuntime.RegistryCredential, error) {
			asked.Add(1)
			if host != reg.Host {
				t.Errorf("asked for host %q, want %q", host, reg.Host)
			}
			return c, err
		}
	}
	ctx := testCtx(t)
	spec, _ := push("authed")
	wrong := "wrong-" + reg.Password
	for _, c := range []struct {
		name  string
		creds func(context.Context, string) (noderuntime.RegistryCredential, error)
		says  string
	}{
		{"no callback", nil, "without a credential"},
		{"anonymous", answer(noderuntime.RegistryCredential{Registry: reg.Host, Anonymous: true}, nil), "without a credential"},
		{"wrong password", answer(noderuntime.RegistryCredential{Registry: reg.Host, Username: reg.User, Secret: wrong}, nil), "with the credential the control plane gave"},
		{"refused", answer(noderuntime.RegistryCredential{}, errors.New("image_not_wanted: no booking")), "none could be had"},
	} {
		s := spec
		s.Credentials = c.creds
		_, err := f.rt.EnsureImage(ctx, s)
		if !errors.Is(err, noderuntime.ErrRegistryAuth) || !strings.Contains(err.Error(), c.says) ||
			!strings.Contains(err.Error(), "registry "+reg.Host) || !strings.Contains(err.Error(), "--registry-auth") {
			t.Fatalf("%s: %v, want ErrRegistryAuth naming %s and saying %q", c.name, err, reg.Host, c.says)
		}
		if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), reg.Password) {
			t.Fatalf("%s: the error holds the secret: %v", c.name, err)
		}
	}
	if asked.Load() == 0 {
		t.Fatal("the callback was never asked")
	}

	// The right credential pulls; the image is then present, and nobody is
	// asked again.
	asked.Store(0)
	spec.Credentials = answer(noderuntime.RegistryCredential{Registry: reg.Host, Username: reg.User, Secret: reg.Password}, nil)
	res, err := f.rt.EnsureImage(ctx, spec)
	if err != nil || res.Source != sourceRegistry {
		t.Fatalf("pull with the credential: %+v %v", res, err)
	}
	if n := asked.Load(); n == 0 {
		t.Fatal("pulled without asking for the credential")
	}
	asked.Store(0)
	if res, err := f.rt.EnsureImage(ctx, spec); err != nil || !res.AlreadyPresent {
		t.Fatalf("second EnsureImage: %+v %v", res, err)
	}
	// An image from an archive needs no registry either.
	img := testenv.BuildBusyboxImage(t, f.imageDir, "archived-private", testenv.WithFile("/etc/variant", "archived-private"))
	arch := noderuntime.ImageSpec{Reference: reg.Host + "/private/archived@" + img.ManifestDigest, ManifestDigest: img.ManifestDigest, Unpack: true,
		Credentials: spec.Credentials}
	if res, err := f.rt.EnsureImage(ctx, arch); err != nil || res.Source != sourceArchive {
		t.Fatalf("archive: %+v %v", res, err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("asked %d times for an image that needed no pull", n)
	}
}

// TestPlainHTTP: loopback registries and those named insecure are spoken
// to over plain HTTP, any spelling of the name alike; others over HTTPS.
func TestPlainHTTP(t *testing.T) {
	r := &registry{insecure: map[string]bool{}}
	for _, h := range []string{"Registry.Internal:5000", "http://10.0.0.5:5000/v2/"} {
		r.insecure[schemas.CanonicalRegistry(h)] = true
	}
	for host, want := range map[string]bool{
		"registry.internal:5000": true, "10.0.0.5:5000": true, "127.0.0.1:5000": true, "localhost:5000": true,
		"registry.internal": false, "registry.internal:5001": false, "ghcr.io": false,
	} {
		if got, err := r.plainHTTP(host); err != nil || got != want {
			t.Errorf("plainHTTP(%s) = %v %v, want %v", host, got, err, want)
		}
	}
}
