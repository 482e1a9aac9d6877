package artifacts_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestResolveByTenant: a tenant's uses resolve to its own records and
// shared ones only; another tenant's record is refused artifact_unknown on
// the same field and in the same words as a missing one, so the refusal
// tells nothing of what another tenant holds.
func TestResolveByTenant(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	register := func(r schemas.ArtifactRecord, tenant string, shared bool) schemas.ArtifactRecord {
		t.Helper()
		r.Tenant, r.Shared = tenant, shared
		got, err := f.cat.Register(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	bV1 := register(f.put(t, "llama", "v1", []byte("b's weights")), "team-b", false)
	aV2 := register(f.put(t, "llama", "v2", []byte("a's weights")), "team-a", false) // newer
	register(f.put(t, "secret-model", "v1", []byte("a only")), "team-a", false)
	common := register(f.put(t, "tokenizer", "v1", []byte("shared")), "team-a", true)
	old := register(f.put(t, "legacy", "v1", []byte("no tenant")), "", false)
	if old.Tenant != schemas.DefaultTenant {
		t.Fatalf("a record naming no tenant is stored as %q, want %q", old.Tenant, schemas.DefaultTenant)
	}

	ms, err := f.cat.Resolve(ctx, "team-b", []schemas.ArtifactUse{{Name: "llama", Path: "/m"}, {Name: "tokenizer", Path: "/t"}})
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].Version != "v1" || ms[0].Digest != bV1.Digest || ms[1].Digest != common.Digest {
		t.Fatalf("team-b's newest llama and the shared tokenizer: %+v", ms)
	}
	if ms, err := f.cat.Resolve(ctx, "team-a", []schemas.ArtifactUse{{Name: "llama", Path: "/m"}}); err != nil || ms[0].Digest != aV2.Digest {
		t.Fatalf("team-a's newest llama: %+v, %v", ms, err)
	}

	// Each foreign use beside the same use of something that does not
	// exist: the same code, field and words (names swapped).
	for _, c := range []struct {
		name             string
		foreign, missing schemas.ArtifactUse
		swap             [2]string
		field            string
	}{
		{"another tenant's version", schemas.ArtifactUse{Name: "llama", Version: "v2", Path: "/m"}, schemas.ArtifactUse{Name: "llama", Version: "v9", Path: "/m"},
			[2]string{"v9", "v2"}, "artifacts[0].version"},
		{"another tenant's digest", schemas.ArtifactUse{Name: "llama", Digest: aV2.Digest, Path: "/m"}, schemas.ArtifactUse{Name: "llama", Digest: digestOf([]byte("none")), Path: "/m"},
			[2]string{digestOf([]byte("none")), aV2.Digest}, "artifacts[0].digest"},
		{"another tenant's name", schemas.ArtifactUse{Name: "secret-model", Path: "/m"}, schemas.ArtifactUse{Name: "nothing-here", Path: "/m"},
			[2]string{"nothing-here", "secret-model"}, "artifacts[0].name"},
		{"another tenant's name and version", schemas.ArtifactUse{Name: "secret-model", Version: "v1", Path: "/m"}, schemas.ArtifactUse{Name: "nothing-here", Version: "v1", Path: "/m"},
			[2]string{"nothing-here", "secret-model"}, "artifacts[0].name"},
		{"the default tenant's record", schemas.ArtifactUse{Name: "legacy", Path: "/m"}, schemas.ArtifactUse{Name: "nothing-here", Path: "/m"},
			[2]string{"nothing-here", "legacy"}, "artifacts[0].name"},
	} {
		_, ferr := f.cat.Resolve(ctx, "team-b", []schemas.ArtifactUse{c.foreign})
		foreign := wantRefusal(t, ferr, schemas.CodeArtifactUnknown, c.field)
		_, merr := f.cat.Resolve(ctx, "team-b", []schemas.ArtifactUse{c.missing})
		missing := wantRefusal(t, merr, schemas.CodeArtifactUnknown, c.field)
		if want := strings.ReplaceAll(missing.Reason, c.swap[0], c.swap[1]); foreign.Reason != want {
			t.Errorf("%s: refused %q; a missing one %q: the words differ", c.name, foreign.Reason, want)
		}
	}
	if _, err := f.cat.Resolve(ctx, schemas.DefaultTenant, []schemas.ArtifactUse{{Name: "legacy", Path: "/m"}}); err != nil {
		t.Fatalf("the default tenant's own record: %v", err)
	}
}

// TestRegisterByTenant: a name and version belong to one tenant: another
// tenant's registration of it is refused artifact_owned, even with the same
// bytes; its sharing cannot change under the same version; the owner's
// registration again answers the stored record.
func TestRegisterByTenant(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rec := f.put(t, "llama", "v1", []byte("a's weights"))
	rec.Tenant = "team-a"
	stored, err := f.cat.Register(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := f.cat.Register(ctx, rec); err != nil || !again.CreatedAt.Equal(stored.CreatedAt) {
		t.Fatalf("the owner's registration again: %+v, %v", again, err)
	}
	theirs := rec
	theirs.Tenant = "team-b"
	wantRefusal(t, noRecord(f.cat.Register(ctx, theirs)), schemas.CodeArtifactOwned, "tenant")
	theirs.Shared = true
	wantRefusal(t, noRecord(f.cat.Register(ctx, theirs)), schemas.CodeArtifactOwned, "tenant")
	reshared := rec
	reshared.Shared = true
	wantRefusal(t, noRecord(f.cat.Register(ctx, reshared)), schemas.CodeInvalidArtifact, "shared")
	bad := rec
	bad.Tenant = "Team_A"
	wantRefusal(t, noRecord(f.cat.Register(ctx, bad)), schemas.CodeInvalidTenant, "tenant")
	if got, err := f.cat.Get(ctx, "llama", "v1"); err != nil || got.Tenant != "team-a" || got.Shared {
		t.Fatalf("stored record changed: %+v, %v", got, err)
	}
}

// TestServiceTenants: the register service stores a configured tenant's
// record and refuses an unknown or malformed tenant naming the field.
func TestServiceTenants(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stop, err := artifacts.NewService(f.cat, f.conn.NC, zap.NewNop(), schemas.DefaultTenant, "team-a").Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rec := f.put(t, "llama", "v1", []byte("weights"))
	for _, c := range []struct {
		tenant string
		code   schemas.Code
	}{{"team-z", schemas.CodeTenantUnknown}, {"Team A", schemas.CodeInvalidTenant}} {
		r := rec
		r.Tenant = c.tenant
		rep, _ := request(t, f.conn.NC, bus.SubjectArtifactRegister, codec.JSON, schemas.ArtifactRegistration{Record: r})
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != "tenant" {
			t.Fatalf("tenant %q: %+v %+v, want %s on tenant", c.tenant, rep.OK, rep.Refusal, c.code)
		}
	}
	rec.Tenant, rec.Shared = "team-a", true
	rep, _ := request(t, f.conn.NC, bus.SubjectArtifactRegister, codec.JSON, schemas.ArtifactRegistration{Record: rec})
	if rep.OK == nil || rep.OK.Tenant != "team-a" || !rep.OK.Shared {
		t.Fatalf("team-a's shared record: %+v %+v", rep.OK, rep.Refusal)
	}
}
