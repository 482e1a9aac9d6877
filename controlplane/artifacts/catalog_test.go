package artifacts_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// clock is a test's time: each reading is one second after the last, so
// versions registered in order have increasing CreatedAt.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

type fixture struct {
	conn *bus.Conn
	cat  *artifacts.Catalog
	obs  jetstream.ObjectStore
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	conn := testenv.ProvisionedBus(t, "cp")
	c := &clock{t: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)}
	cat, err := artifacts.Open(context.Background(), conn.JS, c.now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	obs, err := conn.JS.ObjectStore(context.Background(), bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{conn: conn, cat: cat, obs: obs}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// put stores content as a content-addressed object and returns its record.
func (f fixture) put(t *testing.T, name, version string, content []byte) schemas.ArtifactRecord {
	t.Helper()
	d := digestOf(content)
	obj := "sha256/" + d[len("sha256:"):]
	if _, err := f.obs.PutBytes(context.Background(), obj, content); err != nil {
		t.Fatal(err)
	}
	return schemas.ArtifactRecord{Name: name, Version: version, Digest: d, SizeBytes: int64(len(content)), Source: schemas.ArtifactSource{Object: obj}}
}

func wantRefusal(t *testing.T, err error, code schemas.Code, field string) *schemas.Refusal {
	t.Helper()
	var ref *schemas.Refusal
	if !errors.As(err, &ref) || ref.Code != code || ref.Field != field {
		t.Fatalf("want refusal %s on %q, got %v", code, field, err)
	}
	if ref.Reason == "" {
		t.Fatal("a refusal must say what to do")
	}
	return ref
}

// TestRegisterChecksTheObject: a record for an object is stored only when
// the object exists with the record's digest and size; the same record
// again is answered with the stored one; other content under a stored
// version is refused; a URL source is taken as given.
func TestRegisterChecksTheObject(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rec := f.put(t, "llama", "v1", []byte("weights one"))

	got, err := f.cat.Register(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if got.CreatedAt.IsZero() || got.Digest != rec.Digest {
		t.Fatalf("registered %+v", got)
	}
	again, err := f.cat.Register(ctx, rec)
	if err != nil || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Fatalf("the same registration again: %+v, %v", again, err)
	}

	other := f.put(t, "llama", "v1", []byte("weights two"))
	wantRefusal(t, noRecord(f.cat.Register(ctx, other)), schemas.CodeInvalidArtifact, "version")

	bad := rec
	bad.Version, bad.Digest = "v2", digestOf([]byte("something else"))
	wantRefusal(t, noRecord(f.cat.Register(ctx, bad)), schemas.CodeArtifactDigestMismatch, "digest")
	bad = rec
	bad.Version, bad.SizeBytes = "v2", rec.SizeBytes+1
	wantRefusal(t, noRecord(f.cat.Register(ctx, bad)), schemas.CodeInvalidArtifact, "size_bytes")
	bad = rec
	bad.Version, bad.Source.Object = "v2", "sha256/missing"
	wantRefusal(t, noRecord(f.cat.Register(ctx, bad)), schemas.CodeInvalidArtifact, "source.object")
	bad = rec
	bad.Version, bad.Source = "v2", schemas.ArtifactSource{Object: rec.Source.Object, URL: "https://example.com/w"}
	wantRefusal(t, noRecord(f.cat.Register(ctx, bad)), schemas.CodeInvalidArtifact, "source")
	if _, err := f.cat.Get(ctx, "llama", "v2"); !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatalf("a refused registration stored something: %v", err)
	}

	web := schemas.ArtifactRecord{Name: "dataset", Version: "2026-12", Digest: digestOf([]byte("remote")), SizeBytes: 6,
		Source: schemas.ArtifactSource{URL: "https://data.example.com/set.tar"}}
	if _, err := f.cat.Register(ctx, web); err != nil {
		t.Fatalf("a URL source: %v", err)
	}
}

func noRecord(_ schemas.ArtifactRecord, err error) error { return err }

// TestResolve: a version names its record, a digest the record with it,
// neither the newest version; what the catalog does not hold is refused
// naming the use's field.
func TestResolve(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if rs, err := f.cat.List(ctx, ""); err != nil || len(rs) != 0 {
		t.Fatalf("an empty catalog lists %+v, %v", rs, err)
	}
	_, err := f.cat.Resolve(ctx, schemas.DefaultTenant, []schemas.ArtifactUse{{Name: "llama", Path: "/m"}})
	wantRefusal(t, err, schemas.CodeArtifactUnknown, "artifacts[0].name")
	v1 := f.put(t, "llama", "v1", []byte("one"))
	v2 := f.put(t, "llama", "v0-later", []byte("two")) // registered later, sorts first by name
	for _, r := range []schemas.ArtifactRecord{v1, v2} {
		if _, err := f.cat.Register(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	uses := []schemas.ArtifactUse{
		{Name: "llama", Path: "/models/newest"},
		{Name: "llama", Version: "v1", Path: "/models/v1"},
		{Name: "llama", Digest: v1.Digest, Path: "/models/by-digest"},
	}
	ms, err := f.cat.Resolve(ctx, schemas.DefaultTenant, uses)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ version, path string }{{"v0-later", "/models/newest"}, {"v1", "/models/v1"}, {"v1", "/models/by-digest"}}
	if len(ms) != len(want) {
		t.Fatalf("resolved %+v", ms)
	}
	for i, w := range want {
		if ms[i].Version != w.version || ms[i].Path != w.path || ms[i].Name != "llama" || ms[i].Source.Object == "" || ms[i].SizeBytes != 3 {
			t.Fatalf("mount %d: %+v, want version %s at %s", i, ms[i], w.version, w.path)
		}
	}

	for _, c := range []struct {
		uses  []schemas.ArtifactUse
		field string
	}{
		{[]schemas.ArtifactUse{{Name: "mistral", Path: "/m"}}, "artifacts[0].name"},
		{[]schemas.ArtifactUse{{Name: "llama", Path: "/a"}, {Name: "llama", Version: "v9", Path: "/b"}}, "artifacts[1].version"},
		{[]schemas.ArtifactUse{{Name: "mistral", Version: "v1", Path: "/m"}}, "artifacts[0].name"},
		{[]schemas.ArtifactUse{{Name: "llama", Digest: digestOf([]byte("none")), Path: "/m"}}, "artifacts[0].digest"},
		{[]schemas.ArtifactUse{{Name: "mistral", Digest: v1.Digest, Path: "/m"}}, "artifacts[0].name"},
	} {
		_, err := f.cat.Resolve(ctx, schemas.DefaultTenant, c.uses)
		wantRefusal(t, err, schemas.CodeArtifactUnknown, c.field)
	}
}

// TestListAndRemove: List sorts by name then CreatedAt; Remove deletes a
// version and its object only once no other version names the object.
func TestListAndRemove(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	shared := []byte("the same bytes")
	for _, r := range []schemas.ArtifactRecord{
		f.put(t, "zeta", "a", []byte("z")),
		f.put(t, "alpha", "v2", shared),
		f.put(t, "alpha", "v1", shared),
		f.put(t, "alpha.beta", "v1", []byte("dotted")),
	} {
		if _, err := f.cat.Register(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	all, err := f.cat.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range all {
		got = append(got, r.Name+"/"+r.Version)
	}
	if want := "[alpha/v2 alpha/v1 alpha.beta/v1 zeta/a]"; fmtList(got) != want {
		t.Fatalf("list: %v, want %s", got, want)
	}
	alpha, err := f.cat.List(ctx, "alpha")
	if err != nil || len(alpha) != 2 {
		t.Fatalf("list alpha: %+v, %v", alpha, err)
	}
	obj := alpha[0].Source.Object

	if _, err := f.cat.Remove(ctx, "alpha", "v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.obs.GetInfo(ctx, obj); err != nil {
		t.Fatalf("the object alpha/v1 still names was deleted: %v", err)
	}
	if _, err := f.cat.Get(ctx, "alpha", "v2"); !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatalf("removed version still there: %v", err)
	}
	wantRefusal(t, noRecord(f.cat.Remove(ctx, "alpha", "v2")), schemas.CodeArtifactUnknown, "artifact_version")
	if _, err := f.cat.Remove(ctx, "alpha", "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.obs.GetInfo(ctx, obj); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the object no version names was kept: %v", err)
	}
	rest, err := f.cat.List(ctx, "")
	if err != nil || len(rest) != 2 {
		t.Fatalf("after removal: %+v, %v", rest, err)
	}
}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}

// TestRegisterRace: replicas registering one version at once store it
// once; each answers the stored record, or refuses other content.
func TestRegisterRace(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.put(t, "llama", "v1", []byte("a"))
	b := f.put(t, "llama", "v1", []byte("b"))
	recs := []schemas.ArtifactRecord{a, a, b, a}
	got := make([]schemas.ArtifactRecord, len(recs))
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		wg.Go(func() { got[i], errs[i] = f.cat.Register(ctx, r) })
	}
	wg.Wait()
	stored, err := f.cat.Get(ctx, "llama", "v1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		switch {
		case recs[i].Digest == stored.Digest:
			if errs[i] != nil || !got[i].CreatedAt.Equal(stored.CreatedAt) {
				t.Fatalf("registration %d of the stored content: %+v, %v", i, got[i], errs[i])
			}
		default:
			wantRefusal(t, errs[i], schemas.CodeInvalidArtifact, "version")
		}
	}
}
