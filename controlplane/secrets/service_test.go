package secrets_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/schemas"
)

// ask sends body (raw bytes, or a value encoded as enc) on subject and
// decodes the reply; raw is the reply's bytes.
func ask[R any](t *testing.T, nc *nats.Conn, subject string, enc codec.Encoding, body any) (rep schemas.Reply[R], raw []byte) {
	t.Helper()
	b, ok := body.([]byte)
	if !ok {
		var err error
		if b, err = codec.Encode(enc, body); err != nil {
			t.Fatal(err)
		}
	}
	m := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{enc.ContentType()}}}
	resp, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		t.Fatalf("reply %q: %v", resp.Data, err)
	}
	return rep, resp.Data
}

func serve(t *testing.T, f *storeFixture, log *zap.Logger) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop, err := secrets.NewService(f.store, f.conn.NC, log).Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); cancel(); wg.Wait() })
}

// TestServiceAnswersPerSubjectTenant: set, list and rm act in the tenant
// the subject names, in either encoding; nothing a reply or log line holds
// is the value; refusals are coded and name the field.
func TestServiceAnswersPerSubjectTenant(t *testing.T) {
	f := newStore(t)
	core, logs := observer.New(zapcore.DebugLevel)
	serve(t, f, zap.New(core))
	nc := f.conn.NC
	value := []byte("very-secret-value-42")
	check := func(raw []byte) {
		t.Helper()
		if strings.Contains(string(raw), string(value)) || strings.Contains(string(raw), base64.StdEncoding.EncodeToString(value)) {
			t.Fatalf("reply holds the value: %s", raw)
		}
	}

	for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		rep, raw := ask[schemas.SecretInfo](t, nc, bus.TenantSubject("a", bus.TenantSecretSet), enc, schemas.SecretSetRequest{Name: "tok", Value: value})
		check(raw)
		if rep.Refusal != nil || rep.OK.Tenant != "a" || rep.OK.Name != "tok" || rep.OK.Size != len(value) {
			t.Fatalf("%v set: %+v %+v", enc, rep.OK, rep.Refusal)
		}
	}
	if v, err := f.store.Open(context.Background(), "a", "tok"); err != nil || string(v) != string(value) {
		t.Fatalf("stored value %q, %v", v, err)
	}

	listA, raw := ask[schemas.SecretListReply](t, nc, bus.TenantSubject("a", bus.TenantSecretLs), codec.JSON, []byte{})
	check(raw)
	if listA.OK == nil || listA.OK.Tenant != "a" || len(listA.OK.Secrets) != 1 {
		t.Fatalf("a's list: %s", raw)
	}
	listB, _ := ask[schemas.SecretListReply](t, nc, bus.TenantSubject("b", bus.TenantSecretLs), codec.JSON, []byte{})
	if listB.OK == nil || listB.OK.Tenant != "b" || len(listB.OK.Secrets) != 0 {
		t.Fatalf("b's list: %+v", listB)
	}
	rmB, _ := ask[schemas.SecretInfo](t, nc, bus.TenantSubject("b", bus.TenantSecretRm), codec.JSON, schemas.SecretRemoveRequest{Name: "tok"})
	if rmB.Refusal == nil || rmB.Refusal.Code != schemas.CodeSecretUnknown || rmB.Refusal.Field != "name" {
		t.Fatalf("b removing a's secret: %+v", rmB)
	}
	unknown, _ := ask[schemas.SecretListReply](t, nc, bus.TenantSubject("zz", bus.TenantSecretLs), codec.JSON, []byte{})
	if unknown.Refusal == nil || unknown.Refusal.Code != schemas.CodeTenantUnknown || unknown.Refusal.Field != "tenant" {
		t.Fatalf("unknown tenant: %+v", unknown)
	}

	// Refused bodies: coded, and neither reply nor log echoes the value.
	for name, c := range map[string]struct {
		body  any
		code  schemas.Code
		field string
	}{
		"too large":     {schemas.SecretSetRequest{Name: "big", Value: []byte(strings.Repeat(string(value), schemas.MaxSecretBytes/len(value)+1))}, schemas.CodeSecretTooLarge, "value"},
		"bad name":      {schemas.SecretSetRequest{Name: "a.b", Value: value}, schemas.CodeInvalidSecretName, "name"},
		"unknown field": {[]byte(`{"name":"x","value":"` + base64.StdEncoding.EncodeToString(value) + `","extra":1}`), schemas.CodeUnknownField, ""},
		"not json":      {[]byte(`{"name":"x","value":` + string(value)), schemas.CodeMalformed, ""},
	} {
		rep, raw := ask[schemas.SecretInfo](t, nc, bus.TenantSubject("a", bus.TenantSecretSet), codec.JSON, c.body)
		check(raw)
		if rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != c.field {
			t.Fatalf("%s: %s", name, raw)
		}
	}

	rm, _ := ask[schemas.SecretInfo](t, nc, bus.TenantSubject("a", bus.TenantSecretRm), codec.JSON, schemas.SecretRemoveRequest{Name: "tok"})
	if rm.OK == nil || rm.OK.Name != "tok" {
		t.Fatalf("rm: %+v", rm)
	}
	for _, e := range logs.All() {
		text := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(text, string(value)) || strings.Contains(text, base64.StdEncoding.EncodeToString(value)) {
			t.Fatalf("log line holds the value: %s", text)
		}
	}
	if logs.FilterMessage("secret set refused").Len() == 0 {
		t.Fatal("refused sets were not logged")
	}
}

// TestServiceRotateKey: wf.admin.secret.rotate-key answers counts and
// leaves every secret under the new key.
func TestServiceRotateKey(t *testing.T) {
	f := newStore(t)
	serve(t, f, zap.NewNop())
	ctx := context.Background()
	for _, tenant := range []string{"a", "b", "default"} {
		if _, err := f.store.Set(ctx, tenant, "s", []byte("v-"+tenant)); err != nil {
			t.Fatal(err)
		}
	}
	id, err := secrets.NewKey(f.path)
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := ask[schemas.RotateKeyReply](t, f.conn.NC, bus.SubjectSecretRotateKey, codec.JSON, []byte{})
	if rep.OK == nil || rep.OK.KeyID != id || rep.OK.Resealed != 3 || rep.OK.Current != 0 || rep.OK.Failed != 0 {
		t.Fatalf("rotate: %+v", rep)
	}
	for _, tenant := range []string{"a", "b", "default"} {
		list, err := f.store.List(ctx, tenant)
		if err != nil || len(list) != 1 || list[0].KeyID != id {
			t.Fatalf("%s after rotate: %+v, %v", tenant, list, err)
		}
	}
	again, _ := ask[schemas.RotateKeyReply](t, f.conn.NC, bus.SubjectSecretRotateKey, codec.JSON, schemas.RotateKeyRequest{})
	if again.OK == nil || again.OK.Resealed != 0 || again.OK.Current != 3 {
		t.Fatalf("second rotate: %+v", again)
	}
}
