package sessions_test

import (
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestSessionTenants: an operator's attach or release names a session of
// a configured tenant: a malformed tenant is refused invalid_tenant and an
// unconfigured one tenant_unknown, both naming the field, before any node
// is asked; a configured tenant's attach goes on to placement.
func TestSessionTenants(t *testing.T) {
	f := newFixtureWith(t, sessions.Config{AttachTimeout: 2 * time.Second, DrainTimeout: 2 * time.Second, Tenants: []string{schemas.DefaultTenant, "team-a"}})
	f.addNode(t, "n1", 3)
	attach := f.host(t, "n1", schemas.SessionAttach, func(schemas.SessionCommand) schemas.SessionReply { return schemas.SessionReply{} })
	for _, subject := range []string{bus.SubjectSessionAttach, bus.SubjectSessionRelease} {
		for _, c := range []struct {
			tenant string
			code   schemas.Code
		}{{"Team_A", schemas.CodeInvalidTenant}, {"team-z", schemas.CodeTenantUnknown}} {
			rep := f.ask(t, subject, schemas.SessionRequest{Tenant: c.tenant, Session: "s1"})
			if e := rep.Error; e == nil || e.Code != schemas.SessionCode(c.code) || e.Field != "tenant" || e.Message == "" {
				t.Errorf("%s of tenant %q: %+v, want %s on tenant", subject, c.tenant, rep.Error, c.code)
			}
		}
	}
	if n := len(attach.commands()); n != 0 {
		t.Fatalf("a refused tenant's attach reached the node (%d commands)", n)
	}
	rep := f.ask(t, bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: "team-a", Session: "s1", Node: "n1"})
	if e := rep.Error; e != nil && e.Field == "tenant" {
		t.Fatalf("a configured tenant's attach was refused on its tenant: %+v", e)
	}
	if n := len(attach.commands()); n != 1 || attach.commands()[0].Tenant != "team-a" {
		t.Fatalf("the configured tenant's attach: %+v", attach.commands())
	}
}
