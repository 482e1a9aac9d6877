package intake_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestSecretsCheckedAtIntake: a Run referencing a secret its tenant does
// not hold (missing, or another tenant's) is rejected secret_unknown
// naming the reference's field; one whose secrets all exist is stored
// with its references only, never a value; a control plane without
// secrets refuses any reference.
func TestSecretsCheckedAtIntake(t *testing.T) {
	p, _ := newPlane(t)
	ctx := context.Background()
	keyPath := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := secrets.EnsureKeyFile(keyPath); err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.LoadKeyFile(keyPath, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	store, err := secrets.OpenStore(ctx, p.conn.JS, keys, []string{"acme"}, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("intake-never-sees-this-value")
	for _, s := range []struct{ tenant, name string }{{schemas.DefaultTenant, "api-token"}, {"acme", "acme-only"}} {
		if _, err := store.Set(ctx, s.tenant, s.name, value); err != nil {
			t.Fatal(err)
		}
	}
	in := intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), p.cat, store, nil, time.Now, zap.NewNop())
	withSecrets := func(id string, env []schemas.SecretEnvRef, files []schemas.SecretFileRef) schemas.RunRequest {
		r := request(id)
		r.SecretEnv, r.SecretFiles = env, files
		return r
	}
	rejected := func(id string, field string) {
		t.Helper()
		ev, ok := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, id))
		if !ok || ev.Type != schemas.EventRejected || ev.Code != schemas.CodeSecretUnknown || ev.Field != field {
			t.Fatalf("%s: want a rejection secret_unknown on %s, got %+v (%v)", id, field, ev, ok)
		}
		if _, err := p.runsKV.Get(ctx, schemas.RunIDFor(schemas.DefaultTenant, id)); err == nil {
			t.Fatalf("%s: a rejected Run was stored", id)
		}
	}

	p.submit(t, in, withSecrets("missing-1", []schemas.SecretEnvRef{{Name: "TOKEN", Secret: "api-token"}},
		[]schemas.SecretFileRef{{Secret: "api-token", Path: "/run/a"}, {Secret: "nope", Path: "/run/b"}}))
	rejected("missing-1", "secret_files[1].secret")
	p.submit(t, in, withSecrets("foreign-1", []schemas.SecretEnvRef{{Name: "TOKEN", Secret: "acme-only"}}, nil))
	rejected("foreign-1", "secret_env[0].secret")

	p.submit(t, in, withSecrets("known-1", []schemas.SecretEnvRef{{Name: "TOKEN", Secret: "api-token"}}, []schemas.SecretFileRef{{Secret: "api-token", Path: "/run/a"}}))
	e, err := p.runsKV.Get(ctx, schemas.RunIDFor(schemas.DefaultTenant, "known-1"))
	if err != nil {
		t.Fatalf("known secrets: Run not stored: %v", err)
	}
	if bytes.Contains(e.Value(), value) || !bytes.Contains(e.Value(), []byte(`"api-token"`)) {
		t.Fatalf("stored Run %s: want the reference, never the value", e.Value())
	}
	// The same submit again: one Run, not a conflict (mode 0 is 0400).
	again := withSecrets("known-1", []schemas.SecretEnvRef{{Name: "TOKEN", Secret: "api-token"}}, []schemas.SecretFileRef{{Secret: "api-token", Path: "/run/a", Mode: 0o400}})
	p.submitAs(t, in, again, "known-1-again")
	if ev, _ := p.lastEvent(t, schemas.RunIDFor(schemas.DefaultTenant, "known-1")); ev.Type == schemas.EventRejected {
		t.Fatalf("a duplicate submit was rejected: %+v", ev)
	}

	none := intake.New(p.store, waiting{}, dispatch.New(p.conn.JS, p.cache, time.Now, zap.NewNop()), p.cat, nil, nil, time.Now, zap.NewNop())
	p.submit(t, none, withSecrets("no-store-1", nil, []schemas.SecretFileRef{{Secret: "api-token", Path: "/run/a"}}))
	rejected("no-store-1", "secret_files[0].secret")
}
