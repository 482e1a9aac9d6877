package controlplane_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestTenantsEachHaveAnIntake: a control plane serving tenant team-a (and,
// always, the default one) takes submits from each tenant's own stream,
// and records each Run's tenant and submitter.
func TestTenantsEachHaveAnIntake(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, Tenants: []string{"team-a"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runsKV, err := pl.conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"team-a", schemas.DefaultTenant} {
		b, _ := json.Marshal(schemas.RunRequest{RequestID: "same-id", Image: "registry.example/app@sha256:" + strings.Repeat("1", 64)})
		if _, err := pl.conn.JS.Publish(ctx, bus.SubmitSubject(tenant, "svc-"+tenant), b); err != nil {
			t.Fatalf("submit in %s: %v", tenant, err)
		}
		id := schemas.RunIDFor(tenant, "same-id")
		eventually(t, 10*time.Second, "tenant "+tenant+"'s Run stored", func() bool {
			var r schemas.Run
			_, err := bus.GetJSON(ctx, runsKV, id, &r)
			return err == nil && r.Tenant == tenant && r.SubmittedBy == "svc-"+tenant
		})
	}
}

// TestTenantsConfigRefused: a tenant name that cannot be one is refused
// before anything is provisioned.
func TestTenantsConfigRefused(t *testing.T) {
	n := testenv.StartNATS(t)
	_, err := controlplane.New(context.Background(), testenv.Dial(t, n.URL(), "cp"), controlplane.Config{Tenants: []string{"Team.A"}}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "invalid_tenant") {
		t.Fatalf("New with tenant Team.A: %v, want an invalid_tenant refusal", err)
	}
}
