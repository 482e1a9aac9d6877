package prefetch

import (
	"slices"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestPrefetchTenant: a prefetch names a configured tenant (default when
// it names none) and its record keeps it; an artifact prefetch resolves the
// tenant's own and shared artifacts only, another tenant's being unknown;
// an image prefetch's wanting tenants are what the registry credential
// service gives credentials for; a request id another tenant used is a
// conflict.
func TestPrefetchTenant(t *testing.T) {
	cat := append(slices.Clone(llama),
		schemas.ArtifactRecord{Name: "private", Version: "v1", Digest: llamaV1, SizeBytes: 100, Source: schemas.ArtifactSource{Object: "p/v1"}, Tenant: "team-a"},
		schemas.ArtifactRecord{Name: "tokenizer", Version: "v1", Digest: llamaV2, SizeBytes: 200, Source: schemas.ArtifactSource{Object: "t/v1"}, Tenant: "team-a", Shared: true})
	pl := startPlane(t, []Option{WithArtifacts(cat), WithTenants([]string{schemas.DefaultTenant, "team-a", "team-b"})},
		liveNode("store-a", true), liveNode("store-b", true))
	for _, c := range []struct {
		name  string
		req   schemas.PrefetchRequest
		code  schemas.Code
		field string
	}{
		{"unconfigured tenant", schemas.PrefetchRequest{RequestID: "r1", Artifact: "llama", Tenant: "team-z"}, schemas.CodeTenantUnknown, "tenant"},
		{"malformed tenant", schemas.PrefetchRequest{RequestID: "r2", Artifact: "llama", Tenant: "Team_B"}, schemas.CodeInvalidTenant, "tenant"},
		{"another tenant's artifact", schemas.PrefetchRequest{RequestID: "r3", Artifact: "private", Tenant: "team-b"}, schemas.CodeArtifactUnknown, "artifact"},
		{"the default tenant's artifact", schemas.PrefetchRequest{RequestID: "r4", Artifact: "llama", Tenant: "team-b"}, schemas.CodeArtifactUnknown, "artifact"},
		{"a tenant's artifact for the default tenant", schemas.PrefetchRequest{RequestID: "r5", Artifact: "private"}, schemas.CodeArtifactUnknown, "artifact"},
	} {
		rep := pl.ask(t, c.req)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != c.field {
			t.Errorf("%s: %+v %+v, want %s on %q", c.name, rep.OK, rep.Refusal, c.code, c.field)
		}
	}
	for _, c := range []struct{ req, tenant, artifact string }{{"own", "team-a", "private"}, {"shared", "team-b", "tokenizer"}, {"default", "", "llama"}} {
		rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "art-" + c.req, Artifact: c.artifact, Tenant: c.tenant, Nodes: "store-a"})
		want := c.tenant
		if want == "" {
			want = schemas.DefaultTenant
		}
		if rep.OK == nil || rep.OK.Tenant != want || rep.OK.Artifact.Name != c.artifact {
			t.Fatalf("%s artifact: %+v %+v, want a record of tenant %s", c.req, rep.OK, rep.Refusal, want)
		}
	}

	image := "registry.example/team/app@" + llamaV1
	ref, err := schemas.ParseImageRef("image", image)
	if err != nil {
		t.Fatal(err)
	}
	if rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "img-b", Image: image, Tenant: "team-b", Nodes: "store-a"}); rep.OK == nil || rep.OK.Tenant != "team-b" {
		t.Fatalf("team-b's image prefetch: %+v %+v", rep.OK, rep.Refusal)
	}
	if got := pl.svc.ImageTenants("store-a", ref); !slices.Equal(got, []string{"team-b"}) {
		t.Fatalf("tenants wanting the image on store-a: %v, want [team-b]", got)
	}
	if got := pl.svc.ImageTenants("store-b", ref); len(got) != 0 {
		t.Fatalf("tenants wanting the image on store-b, which no prefetch names: %v", got)
	}
	if rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "img-b", Image: image, Tenant: "team-a", Nodes: "store-a"}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeRequestIDConflict {
		t.Fatalf("team-b's request id sent by team-a: %+v %+v, want request_id_conflict", rep.OK, rep.Refusal)
	}
	if rep := pl.ask(t, schemas.PrefetchRequest{RequestID: "img-a", Image: image, Tenant: "team-a", Nodes: "store-a"}); rep.OK == nil {
		t.Fatalf("team-a's image prefetch: %+v", rep.Refusal)
	}
	if got := pl.svc.ImageTenants("store-a", ref); !slices.Equal(got, []string{"team-a", "team-b"}) {
		t.Fatalf("tenants wanting the image on store-a: %v, want [team-a team-b]", got)
	}
}
