package e2e

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	digest "github.com/opencontainers/go-digest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// otherPlatform is a platform this host is not: linux/arm64/v8, or
// linux/amd64 on an arm64 host.
func otherPlatform() schemas.Platform {
	if runtime.GOARCH == "arm64" {
		return schemas.Platform{OS: "linux", Architecture: "amd64"}
	}
	return schemas.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
}

// TestAcceptance_MultiPlatformImage: a Run pinned to the digest of an index
// with two builds (this host's and another platform's) runs this host's
// build; the node fetched that build alone (the other's manifest, config
// and layers are not in its content store), and its facts hold the index
// as this host's platform, hot. A Run of an index with no build for the
// node fails with platform_not_in_image, naming the builds there are.
func TestAcceptance_MultiPlatformImage(t *testing.T) {
	w := newWorld(t)
	reg := testenv.StartRegistry(t)
	f := newFleet(t, func(c *controlplane.Config) {
		c.RegistryAuth = registryAuthFile(t, map[string][2]string{reg.Host: {reg.User, reg.Password}}, nil)
	})
	dir := t.TempDir()
	other := otherPlatform()
	hostBuild := testenv.BuildBusyboxImage(t, dir, "multi-host", testenv.WithFile("/etc/build", "host build"))
	otherBuild := testenv.BuildBusyboxImage(t, dir, "multi-other", testenv.WithFile("/etc/build", "other build"), testenv.WithPlatform(other))
	ref := reg.PushIndex(t, "multi", hostBuild, otherBuild)
	third := schemas.Platform{OS: "linux", Architecture: "s390x"}
	if runtime.GOARCH == "s390x" {
		third.Architecture = "ppc64le"
	}
	thirdBuild := testenv.BuildBusyboxImage(t, dir, "multi-third", testenv.WithFile("/etc/build", "third build"), testenv.WithPlatform(third))
	foreignOnly := reg.PushIndex(t, "foreign-only", otherBuild, thirdBuild)

	f.startAgent(agentSpec{id: "multi-node", world: w})
	enrolled := f.nodeRecord("multi-node").Facts
	if enrolled == nil || enrolled.Host.OS != runtime.GOOS || enrolled.Host.Architecture != runtime.GOARCH {
		t.Fatalf("node facts %+v, want this host's platform", enrolled)
	}

	id := f.submit(schemas.RunRequest{RequestID: "multi-run", Image: ref, Command: []string{"cat", "/etc/build"}})
	f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	if out := f.stored(id).bytes[[2]string{schemas.WorkloadID(id, 1), bus.LogStdout}]; string(out) != "host build" {
		t.Errorf("the Run printed %q, want this host's build's /etc/build", out)
	}

	// Only this host's build was fetched.
	held := contentStore(t, w)
	for _, d := range buildBlobs(t, reg, hostBuild) {
		if !held(d) {
			t.Errorf("this host's build: blob %s is not in the node's content store", d)
		}
	}
	for _, d := range buildBlobs(t, reg, otherBuild) {
		if held(d) {
			t.Errorf("the %s build: blob %s is in the node's content store; only the host's build may be fetched", other, d)
		}
	}

	// The node's facts say which build of the index it holds.
	indexDigest := ref[strings.LastIndex(ref, "@")+1:]
	var got schemas.ImageLocality
	f.eventually(30*time.Second, "facts listing the index as this host's build, hot", func() bool {
		facts := f.nodeRecord("multi-node").Facts
		if facts == nil {
			return false
		}
		for _, im := range facts.Images {
			if im.ManifestDigest == indexDigest {
				got = im
				return im.State == schemas.LocalityHot
			}
		}
		return false
	})
	if want := (schemas.Platform{OS: "linux", Architecture: runtime.GOARCH}); !got.Index || got.Platform.OS != want.OS || got.Platform.Architecture != want.Architecture || !got.ContentPresent {
		t.Fatalf("facts hold the index as %+v; want index, %s, content present", got, want)
	}

	// An index without this host's build: the Run fails, coded.
	noneID := f.submit(schemas.RunRequest{RequestID: "foreign-only-run", Image: foreignOnly, Command: []string{"true"}})
	failed := f.waitPhase(noneID, schemas.PhaseFailed, 90*time.Second)
	if failed.Reason != string(schemas.CodePlatformNotInImage) {
		t.Fatalf("run of an index without this host's build failed with %q, want %s", failed.Reason, schemas.CodePlatformNotInImage)
	}
	var told bool
	for _, ev := range f.events(noneID) {
		told = told || (ev.Phase == schemas.PhaseFailed && strings.Contains(ev.Message, other.OS+"/"+other.Architecture) && strings.Contains(ev.Message, third.OS+"/"+third.Architecture))
	}
	if !told {
		t.Errorf("no failure event names the builds the index has: %+v", f.events(noneID))
	}
}

// contentStore answers whether w's containerd holds a blob in its
// namespace.
func contentStore(t *testing.T, w world) func(digest.Digest) bool {
	t.Helper()
	client, err := ctrd.New(w.ctrd.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx := namespaces.WithNamespace(context.Background(), w.ctrd.Namespace)
	return func(d digest.Digest) bool {
		t.Helper()
		_, err := client.ContentStore().Info(ctx, d)
		if err != nil && !errdefs.IsNotFound(err) {
			t.Fatalf("content info %s: %v", d, err)
		}
		return err == nil
	}
}

// buildBlobs are one build's manifest, config and layer digests, as the
// registry serves them.
func buildBlobs(t *testing.T, reg *testenv.Registry, img testenv.Image) []digest.Digest {
	t.Helper()
	ref, err := name.NewDigest(reg.Host+"/multi@"+img.ManifestDigest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	ri, err := remote.Image(ref, remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password}))
	if err != nil {
		t.Fatalf("read %s back from the registry: %v", ref, err)
	}
	config, err := ri.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := ri.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := []digest.Digest{digest.Digest(img.ManifestDigest), digest.Digest(config.String())}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, digest.Digest(d.String()))
	}
	return out
}
