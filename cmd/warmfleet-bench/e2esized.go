package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/namespaces"
	"github.com/nats-io/nats.go/jetstream"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
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

// benchArtifact is the artifact every timed Run mounts.
type benchArtifact struct {
	rec schemas.ArtifactRecord
	// storeDir is the agent's replica store, where a cold case removes it.
	storeDir string
}

// putArtifact stores mib MiB of incompressible bytes in the artifact
// bucket and registers them in the catalog as the control plane's admin
// API does for `warmfleet artifact put`.
func putArtifact(ctx context.Context, conn *bus.Conn, mib int) (schemas.ArtifactRecord, error) {
	// Few chunks in flight: a GB-sized put otherwise overruns the stream's
	// inbound queue on a busy machine (429 too many requests).
	js, err := jetstream.New(conn.NC, jetstream.WithPublishAsyncMaxPending(64))
	if err != nil {
		return schemas.ArtifactRecord{}, err
	}
	obs, err := js.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		return schemas.ArtifactRecord{}, err
	}
	size := int64(mib) << 20
	var key [32]byte
	key[0], key[1] = 0xa7, byte(rand.Uint32())
	h := sha256.New()
	object := fmt.Sprintf("bench/weights-%x", key[1])
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: object}, io.TeeReader(io.LimitReader(rand.NewChaCha8(key), size), h)); err != nil {
		return schemas.ArtifactRecord{}, fmt.Errorf("put %d MiB: %w", mib, err)
	}
	rec := schemas.ArtifactRecord{Name: "bench-weights", Version: "v1", Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), SizeBytes: size,
		Source: schemas.ArtifactSource{Object: object}}
	body, err := json.Marshal(schemas.ArtifactRegistration{Version: schemas.SchemaVersion, Record: rec})
	if err != nil {
		return rec, err
	}
	resp, err := conn.NC.RequestWithContext(ctx, bus.SubjectArtifactRegister, body)
	if err != nil {
		return rec, fmt.Errorf("register artifact: %w", err)
	}
	var rep schemas.Reply[schemas.ArtifactRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return rec, err
	}
	if rep.Refusal != nil || rep.OK == nil {
		return rec, fmt.Errorf("register artifact: refused: %+v", rep.Refusal)
	}
	return *rep.OK, nil
}

// rawArtifact is the transfer floor for the artifact: a plain object Get
// through the link, discarded.
func rawArtifact(ctx context.Context, conn *bus.Conn, object string) (int64, error) {
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		return 0, err
	}
	r, err := obs.Get(ctx, object)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return io.Copy(io.Discard, r)
}

// removeReplica deletes the agent's replica of digest with the store's own
// Remove (it refuses one in use) and checks it is gone.
func (b benchArtifact) removeReplica() error {
	s, err := artifactstore.New(b.storeDir)
	if err != nil {
		return err
	}
	if err := s.Remove(b.rec.Digest); err != nil && !errors.Is(err, artifactstore.ErrNotFound) {
		return err
	}
	if _, err := os.Stat(s.Path(b.rec.Digest)); !os.IsNotExist(err) {
		return fmt.Errorf("artifact replica %s survived its removal: %v", b.rec.Digest, err)
	}
	return nil
}

// dropAndCheck deletes the images pinned by manifests in every namespace
// given, collects, and checks that each layer in gone has neither content
// nor unpacked snapshot left anywhere, and that each in kept still has its
// content. A container still being removed can hold a snapshot for a
// moment, so the collection is repeated (bounded) until the check passes.
func dropAndCheck(ctx context.Context, address string, manifests []digest.Digest, gone, kept []familyLayer, nss ...string) error {
	for _, m := range manifests {
		if err := dropImage(ctx, address, m, nss...); err != nil {
			return err
		}
	}
	client, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	var last error
	for range 40 {
		if last = checkLayers(ctx, client, gone, kept, nss); last == nil {
			return nil
		}
		// Collect again: a lease deleted synchronously runs the collector.
		lctx := namespaces.WithNamespace(ctx, nss[0])
		l, err := client.LeasesService().Create(lctx, leases.WithRandomID())
		if err != nil {
			return err
		}
		if err := client.LeasesService().Delete(lctx, l, leases.SynchronousDelete); err != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("the next pull would not be cold: %w", last)
}

// familyLayer is a layer and the chain ID of its unpacked snapshot.
type familyLayer struct {
	digest, chain digest.Digest
}

func layersOf(img familyImage, from int) []familyLayer {
	diffs := make([]digest.Digest, len(img.diffIDs))
	for i, d := range img.diffIDs {
		diffs[i] = digest.Digest(d.String())
	}
	chains := identity.ChainIDs(diffs)
	var out []familyLayer
	for i := from; i < len(img.layers); i++ {
		out = append(out, familyLayer{digest: digest.Digest(img.layers[i].String()), chain: chains[i]})
	}
	return out
}

func checkLayers(ctx context.Context, client *containerd.Client, gone, kept []familyLayer, nss []string) error {
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		for _, l := range gone {
			if _, err := client.ContentStore().Info(nctx, l.digest); !errdefs.IsNotFound(err) {
				return fmt.Errorf("layer %s still in namespace %s's content (%v)", l.digest, ns, err)
			}
			if _, err := client.SnapshotService(containerd.DefaultSnapshotter).Stat(nctx, l.chain.String()); !errdefs.IsNotFound(err) {
				return fmt.Errorf("layer %s still unpacked in namespace %s (%v)", l.digest, ns, err)
			}
		}
		for _, l := range kept {
			if _, err := client.ContentStore().Info(nctx, l.digest); err != nil {
				return fmt.Errorf("shared layer %s gone from namespace %s: %w", l.digest, ns, err)
			}
		}
	}
	return nil
}

// span is one runtime call's start and end.
type span struct{ start, end time.Time }

// timedRuntime records when the agent's EnsureImage and Launch calls
// start and end, so a Run's preparing stage splits into the artifact fetch
// (which the attempt's queue applies first) and the image pull; and when
// its Images calls do, the image inventory of each facts measurement, so a
// launch one overlapped is counted.
type timedRuntime struct {
	noderuntime.Runtime
	mu                             sync.Mutex
	ensures, launches, inventories []span
}

func (t *timedRuntime) EnsureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	s := time.Now()
	res, err := t.Runtime.EnsureImage(ctx, spec)
	t.record(&t.ensures, s)
	return res, err
}

func (t *timedRuntime) Launch(ctx context.Context, spec noderuntime.WorkloadSpec) (noderuntime.WorkloadStatus, error) {
	s := time.Now()
	st, err := t.Runtime.Launch(ctx, spec)
	t.record(&t.launches, s)
	return st, err
}

func (t *timedRuntime) Images(ctx context.Context) ([]schemas.ImageLocality, error) {
	s := time.Now()
	imgs, err := t.Runtime.Images(ctx)
	t.record(&t.inventories, s)
	return imgs, err
}

// inventoryDuring reports whether an image inventory overlapped l.
func (t *timedRuntime) inventoryDuring(l span) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.ContainsFunc(t.inventories, func(s span) bool { return s.start.Before(l.end) && l.start.Before(s.end) })
}

func (t *timedRuntime) record(to *[]span, start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	*to = append(*to, span{start, time.Now()})
	if len(*to) > 64 {
		*to = (*to)[len(*to)-64:]
	}
}

// since is the first EnsureImage and the last Launch that started at or
// after t0.
func (t *timedRuntime) since(t0 time.Time) (ensure, launch span, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.ensures {
		if !s.start.Before(t0) {
			ensure, ok = s, true
			break
		}
	}
	found := false
	for _, s := range t.launches {
		if !s.start.Before(t0) {
			launch, found = s, true
		}
	}
	return ensure, launch, ok && found
}

// sizedStages are a Run's stages, in order; all on this process's clock
// (the control plane runs in it).
var sizedStages = []string{"queue (submit→accepted)", "decision (accepted→placed)", "dispatch (placed→preparing)",
	"artifact (preparing→image ensure)", "image pull + unpack", "ensure→launch", "launch (containerd create + start)", "report (→running seen)"}

type sizedCase struct {
	total  []time.Duration
	floor  []time.Duration
	raw    []time.Duration // the floor's transfer part
	direct []time.Duration // the floor's unpack + start part
	stages map[string][]time.Duration
	// factsDuring counts the Runs whose launch a facts measurement overlapped.
	factsDuring int
}

func newSizedCase() *sizedCase { return &sizedCase{stages: map[string][]time.Duration{}} }

func (c *sizedCase) addRun(t0, accepted time.Time, ph, seen map[schemas.Phase]time.Time, ensure, launch span) {
	running := seen[schemas.PhaseRunning]
	c.total = append(c.total, running.Sub(t0))
	marks := []time.Time{t0, accepted, ph[schemas.PhasePlaced], ph[schemas.PhasePreparing], ensure.start, ensure.end, launch.start, launch.end, running}
	for i, name := range sizedStages {
		if !marks[i].IsZero() && !marks[i+1].IsZero() {
			c.stages[name] = append(c.stages[name], marks[i+1].Sub(marks[i]))
		}
	}
}

// pairedRatio is the median of each Run's time over the floor measured
// beside it (the i-th of each): on a shared machine load comes in bursts,
// and a pair sees the same burst where two medians need not.
func (c *sizedCase) pairedRatio() float64 {
	n := min(len(c.total), len(c.floor))
	r := make([]float64, 0, n)
	for i := range n {
		if c.floor[i] > 0 {
			r = append(r, float64(c.total[i])/float64(c.floor[i]))
		}
	}
	if len(r) == 0 {
		return 0
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}

// pct is the p-th percentile (nearest rank) in ms.
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return ms(s[max(0, min(i, len(s)-1))])
}
