package secrets_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

type storeFixture struct {
	conn  *bus.Conn
	kv    jetstream.KeyValue
	path  string
	keys  *secrets.KeyFile
	store *secrets.Store
}

func newStore(t *testing.T) *storeFixture {
	t.Helper()
	f := &storeFixture{conn: testenv.ProvisionedBus(t, "secrets-test"), path: keyFile(t)}
	f.keys = load(t, f.path)
	ctx := context.Background()
	var err error
	if f.store, err = secrets.OpenStore(ctx, f.conn.JS, f.keys, []string{"a", "b"}, nil, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if f.kv, err = f.conn.JS.KeyValue(ctx, bus.BucketSecrets); err != nil {
		t.Fatal(err)
	}
	return f
}

func wantCode(t *testing.T, err error, code schemas.Code, field string) {
	t.Helper()
	var r *schemas.Refusal
	if !errors.As(err, &r) || r.Code != code || r.Field != field {
		t.Fatalf("err %v, want %s naming %q", err, code, field)
	}
}

// noPlainValue fails if any stored value or history of wf_secrets holds
// value, or its base64.
func noPlainValue(t *testing.T, kv jetstream.KeyValue, value []byte) {
	t.Helper()
	ctx := context.Background()
	l, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b64 := []byte(base64.StdEncoding.EncodeToString(value))
	for k := range l.Keys() {
		h, err := kv.History(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h {
			if bytes.Contains(e.Value(), value) || bytes.Contains(e.Value(), b64) {
				t.Fatalf("%s revision %d holds the value in the clear", k, e.Revision())
			}
		}
	}
}

func TestStoreSetOpenListRemove(t *testing.T) {
	f := newStore(t)
	ctx := context.Background()
	value := []byte("s3cr3t-value\n")
	info, err := f.store.Set(ctx, "a", "API_TOKEN", value)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != len(value) || info.KeyID != f.keys.Keyring().SealingKeyID() || info.CreatedAt.IsZero() {
		t.Fatalf("info %+v", info)
	}
	got, err := f.store.Open(ctx, "a", "API_TOKEN")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	noPlainValue(t, f.kv, value)
	if ok, err := f.store.Exists(ctx, "a", "API_TOKEN"); !ok || err != nil {
		t.Fatalf("Exists = %v, %v", ok, err)
	}
	// Replaced: same creation time, new value.
	time.Sleep(2 * time.Millisecond)
	again, err := f.store.Set(ctx, "a", "API_TOKEN", []byte("v2"))
	if err != nil || !again.CreatedAt.Equal(info.CreatedAt) || !again.UpdatedAt.After(info.UpdatedAt) || again.Size != 2 {
		t.Fatalf("replace: %+v, %v", again, err)
	}
	if got, _ := f.store.Open(ctx, "a", "API_TOKEN"); string(got) != "v2" {
		t.Fatalf("after replace: %q", got)
	}
	if _, err := f.store.Set(ctx, "a", "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	list, err := f.store.List(ctx, "a")
	if err != nil || len(list) != 2 || list[0].Name != "API_TOKEN" || list[1].Name != "other" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := f.store.Remove(ctx, "a", "API_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Open(ctx, "a", "API_TOKEN"); !errors.Is(err, secrets.ErrSecretNotFound) {
		t.Fatalf("Open after Remove: %v", err)
	}
	if ok, err := f.store.Exists(ctx, "a", "API_TOKEN"); ok || err != nil {
		t.Fatalf("Exists after Remove = %v, %v", ok, err)
	}
	_, err = f.store.Remove(ctx, "a", "API_TOKEN")
	wantCode(t, err, schemas.CodeSecretUnknown, "name")
	// The removed secret's sealed value is gone from the bucket.
	h, _ := f.kv.History(ctx, schemas.SecretKey("a", "API_TOKEN"))
	if len(h) != 1 || h[0].Operation() == jetstream.KeyValuePut {
		t.Fatalf("history after remove: %d entries", len(h))
	}
}

// TestStoreTenantIsolation: tenant b sees, opens and removes nothing of
// a's, and a secret's record moved to another tenant's key does not open.
func TestStoreTenantIsolation(t *testing.T) {
	f := newStore(t)
	ctx := context.Background()
	if _, err := f.store.Set(ctx, "a", "shared_name", []byte("a's value")); err != nil {
		t.Fatal(err)
	}
	if list, err := f.store.List(ctx, "b"); err != nil || len(list) != 0 {
		t.Fatalf("b lists %+v, %v", list, err)
	}
	if ok, err := f.store.Exists(ctx, "b", "shared_name"); ok || err != nil {
		t.Fatalf("b's Exists = %v, %v", ok, err)
	}
	if _, err := f.store.Open(ctx, "b", "shared_name"); !errors.Is(err, secrets.ErrSecretNotFound) {
		t.Fatalf("b's Open: %v", err)
	}
	_, err := f.store.Remove(ctx, "b", "shared_name")
	wantCode(t, err, schemas.CodeSecretUnknown, "name")
	if v, err := f.store.Open(ctx, "a", "shared_name"); err != nil || string(v) != "a's value" {
		t.Fatalf("a's secret after b's tries: %q, %v", v, err)
	}
	// A's record copied under b's key: b's Open refuses it.
	e, err := f.kv.Get(ctx, schemas.SecretKey("a", "shared_name"))
	if err != nil {
		t.Fatal(err)
	}
	moved := strings.Replace(string(e.Value()), `"tenant":"a"`, `"tenant":"b"`, 1)
	if _, err := f.kv.Put(ctx, schemas.SecretKey("b", "shared_name"), []byte(moved)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Open(ctx, "b", "shared_name"); !errors.Is(err, secrets.ErrBrokenSeal) {
		t.Fatalf("moved record opened for b: %v", err)
	}
	// Same names in each tenant stay apart.
	if _, err := f.store.Set(ctx, "b", "shared_name", []byte("b's value")); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.store.Open(ctx, "a", "shared_name"); string(v) != "a's value" {
		t.Fatalf("a's value became %q", v)
	}
}

func TestStoreRefusals(t *testing.T) {
	f := newStore(t)
	ctx := context.Background()
	_, err := f.store.Set(ctx, "zz", "n", []byte("v"))
	wantCode(t, err, schemas.CodeTenantUnknown, "tenant")
	_, err = f.store.Set(ctx, "Bad Tenant", "n", []byte("v"))
	wantCode(t, err, schemas.CodeInvalidTenant, "tenant")
	_, err = f.store.Open(ctx, "zz", "n")
	wantCode(t, err, schemas.CodeTenantUnknown, "tenant")
	_, err = f.store.Set(ctx, "a", "has.dot", []byte("v"))
	wantCode(t, err, schemas.CodeInvalidSecretName, "name")
	_, err = f.store.Set(ctx, "a", "n", nil)
	wantCode(t, err, schemas.CodeMissingField, "value")
	big := bytes.Repeat([]byte("x"), schemas.MaxSecretBytes+1)
	_, err = f.store.Set(ctx, "a", "n", big)
	wantCode(t, err, schemas.CodeSecretTooLarge, "value")
	if strings.Contains(err.Error(), "xxxx") {
		t.Fatal("refusal echoes the value")
	}
	if _, err := f.store.Set(ctx, "a", "n", big[:schemas.MaxSecretBytes]); err != nil {
		t.Fatalf("a value of exactly the limit: %v", err)
	}
	if _, err := f.store.Set(ctx, "default", "n", []byte("v")); err != nil {
		t.Fatalf("the default tenant is always served: %v", err)
	}
}

// TestStoreTenantLimit: a tenant holding the most secrets may replace
// one but add none; another tenant is not held back.
func TestStoreTenantLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 1000 secrets")
	}
	f := newStore(t)
	ctx := context.Background()
	for i := range schemas.MaxSecretsPerTenant {
		// Written straight into the bucket: 1,000 seals through Set would
		// only slow the test down.
		rec := schemas.SealedSecret{Tenant: "a", Name: fmt.Sprintf("s%d", i), KeyID: "k", Sealed: []byte{1}, Size: 1}
		if _, err := bus.CreateJSON(ctx, f.kv, schemas.SecretKey(rec.Tenant, rec.Name), rec); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.store.Set(ctx, "a", "one_more", []byte("v"))
	wantCode(t, err, schemas.CodeTooManySecrets, "name")
	if _, err := f.store.Set(ctx, "a", "s7", []byte("v")); err != nil {
		t.Fatalf("replacing one at the limit: %v", err)
	}
	if _, err := f.store.Set(ctx, "b", "one_more", []byte("v")); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
}

// TestStoreCASConcurrentSets: concurrent sets of one secret each land
// whole, by CAS; the value read is one of them.
func TestStoreCASConcurrentSets(t *testing.T) {
	f := newStore(t)
	ctx := context.Background()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			_, err := f.store.Set(ctx, "a", "raced", []byte(fmt.Sprintf("value-%d", i)))
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	v, err := f.store.Open(ctx, "a", "raced")
	if err != nil || !strings.HasPrefix(string(v), "value-") {
		t.Fatalf("Open = %q, %v", v, err)
	}
	if list, _ := f.store.List(ctx, "a"); len(list) != 1 {
		t.Fatalf("%d records", len(list))
	}
}

// TestStoreReseal: after a new key, Reseal moves every secret under it;
// the old key can then leave the file and everything still opens; a
// secret whose key is gone is counted failed and named.
func TestStoreReseal(t *testing.T) {
	f := newStore(t)
	ctx := context.Background()
	oldID := f.keys.Keyring().SealingKeyID()
	for _, n := range []string{"one", "two"} {
		if _, err := f.store.Set(ctx, "a", n, []byte("value of "+n)); err != nil {
			t.Fatal(err)
		}
	}
	newID, err := secrets.NewKey(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := f.store.Set(ctx, "b", "three", []byte("value of three")); err != nil || info.KeyID != newID {
		t.Fatalf("set after new key: %+v, %v", info, err)
	}
	rep, err := f.store.Reseal(ctx)
	if err != nil || rep.KeyID != newID || rep.Resealed != 2 || rep.Current != 1 || rep.Failed != 0 {
		t.Fatalf("Reseal = %+v, %v", rep, err)
	}
	dropKey(t, f.path, oldID)
	bump(t, f.path)
	if f.keys.Keyring().Has(oldID) {
		t.Fatal("old key still in the keyring")
	}
	for tenant, names := range map[string][]string{"a": {"one", "two"}, "b": {"three"}} {
		for _, n := range names {
			if v, err := f.store.Open(ctx, tenant, n); err != nil || string(v) != "value of "+n {
				t.Fatalf("%s/%s after rotation: %q, %v", tenant, n, v, err)
			}
		}
	}
	// A record under a key no longer in the file fails, named.
	rec := schemas.SealedSecret{Tenant: "a", Name: "lost", KeyID: oldID, Sealed: bytes.Repeat([]byte{1}, 60), Size: 3}
	if _, err := bus.CreateJSON(ctx, f.kv, schemas.SecretKey("a", "lost"), rec); err != nil {
		t.Fatal(err)
	}
	rep, err = f.store.Reseal(ctx)
	if err != nil || rep.Failed != 1 || rep.Current != 3 || len(rep.FailedSecrets) != 1 || rep.FailedSecrets[0] != "a.lost" {
		t.Fatalf("Reseal with a lost key = %+v, %v", rep, err)
	}
}

// dropKey removes the key id's line from the key file.
func dropKey(t *testing.T, path, id string) {
	t.Helper()
	var keep []string
	for _, l := range strings.SplitAfter(readFile(t, path), "\n") {
		if !strings.HasPrefix(l, id+" ") {
			keep = append(keep, l)
		}
	}
	writeFile(t, path, strings.Join(keep, ""))
}
