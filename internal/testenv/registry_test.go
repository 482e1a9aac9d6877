package testenv

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestRegistryPushAndAuth pushes an image and a two-platform index, then
// reads them back: with the account, and refused without it or with a
// wrong password.
func TestRegistryPushAndAuth(t *testing.T) {
	reg := StartRegistry(t)
	dir := t.TempDir()
	img := BuildBusyboxImage(t, dir, "one")
	ref := reg.Push(t, "team/one", img)
	if want := reg.Host + "/team/one@" + img.ManifestDigest; ref != want {
		t.Fatalf("Push = %s, want %s (the archive's own manifest digest)", ref, want)
	}
	other := BuildBusyboxImage(t, dir, "one-arm", WithPlatform(schemas.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}))
	idxRef := reg.PushIndex(t, "team/multi", img, other)

	good := remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password})
	r, err := name.ParseReference(idxRef, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(r, good)
	if err != nil {
		t.Fatalf("read index: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range m.Manifests {
		got = append(got, d.Platform.String()+"="+d.Digest.String())
	}
	if len(got) != 2 || !strings.Contains(strings.Join(got, " "), "linux/arm64/v8="+other.ManifestDigest) ||
		!strings.Contains(strings.Join(got, " "), "="+img.ManifestDigest) {
		t.Fatalf("index lists %v, want both images under their platforms", got)
	}

	r1, _ := name.ParseReference(ref, name.Insecure)
	for _, opt := range []remote.Option{remote.WithAuth(authn.Anonymous), remote.WithAuth(&authn.Basic{Username: reg.User, Password: "wrong"})} {
		_, err := remote.Get(r1, opt)
		var terr *transport.Error
		if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
			t.Errorf("get without the account: %v, want 401", err)
		}
	}
}

// TestRegistryBlobDelaySlowsBlobs: the proxy still serves every byte.
func TestRegistryBlobDelaySlowsBlobs(t *testing.T) {
	reg := StartRegistry(t, WithoutAuth(), WithBlobDelay(1))
	img := BuildBusyboxImage(t, t.TempDir(), "slow")
	ref := reg.Push(t, "slow", img)
	if !strings.HasPrefix(ref, reg.Host+"/") || reg.Host == reg.Direct {
		t.Fatalf("reference %s does not go through the proxy %s (registry %s)", ref, reg.Host, reg.Direct)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	got, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := got.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v %v", layers, err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := rc.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	if size, _ := layers[0].Size(); n != size {
		t.Fatalf("read %d bytes through the proxy, layer is %d", n, size)
	}
}
