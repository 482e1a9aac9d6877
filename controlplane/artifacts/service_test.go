package artifacts_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/schemas"
)

// request sends body on subject with the encoding's content type and
// decodes the reply in the encoding the reply names.
func request(t *testing.T, nc *nats.Conn, subject string, enc codec.Encoding, body any) (schemas.Reply[schemas.ArtifactRecord], codec.Encoding) {
	t.Helper()
	b, err := codec.Encode(enc, body)
	if err != nil {
		t.Fatal(err)
	}
	return requestRaw(t, nc, subject, &nats.Msg{Subject: subject, Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{enc.ContentType()}}})
}

func requestRaw(t *testing.T, nc *nats.Conn, subject string, m *nats.Msg) (schemas.Reply[schemas.ArtifactRecord], codec.Encoding) {
	t.Helper()
	resp, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.ArtifactRecord]
	enc := codec.Detect(resp.Header, resp.Data)
	if err := codec.Decode(enc, resp.Data, &rep); err != nil {
		t.Fatalf("reply %q: %v", resp.Data, err)
	}
	return rep, enc
}

// TestServiceOverNATS: register and remove answered over NATS in the
// request's encoding, refusals coded and naming the field.
func TestServiceOverNATS(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stop, err := artifacts.NewService(f.cat, f.conn.NC, zap.NewNop()).Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rec := f.put(t, "llama", "v1", []byte("weights"))

	rep, enc := request(t, f.conn.NC, bus.SubjectArtifactRegister, codec.JSON, schemas.ArtifactRegistration{Record: rec})
	if rep.Refusal != nil || rep.OK == nil || rep.OK.CreatedAt.IsZero() || enc != codec.JSON {
		t.Fatalf("register: %+v %+v (%s)", rep.OK, rep.Refusal, enc)
	}
	again := rec
	again.Version = "v2"
	rep, enc = request(t, f.conn.NC, bus.SubjectArtifactRegister, codec.MsgPack, schemas.ArtifactRegistration{Version: 1, Record: again})
	if rep.Refusal != nil || rep.OK == nil || rep.OK.Version != "v2" || enc != codec.MsgPack {
		t.Fatalf("register in msgpack: %+v %+v (%s)", rep.OK, rep.Refusal, enc)
	}

	wrong := rec
	wrong.Version, wrong.Digest = "v3", digestOf([]byte("not it"))
	for _, c := range []struct {
		name  string
		msg   *nats.Msg
		code  schemas.Code
		field string
	}{
		{"digest mismatch", jsonMsg(t, bus.SubjectArtifactRegister, schemas.ArtifactRegistration{Record: wrong}), schemas.CodeArtifactDigestMismatch, "digest"},
		{"not json", &nats.Msg{Subject: bus.SubjectArtifactRegister, Data: []byte("{nope")}, schemas.CodeMalformed, ""},
		{"unknown field", &nats.Msg{Subject: bus.SubjectArtifactRegister, Data: []byte(`{"record":{},"colour":1}`)}, schemas.CodeUnknownField, ""},
		{"future version", jsonMsg(t, bus.SubjectArtifactRegister, schemas.ArtifactRegistration{Version: 99, Record: rec}), schemas.CodeUnsupportedVersion, "version"},
		{"bad name", jsonMsg(t, bus.SubjectArtifactRegister, schemas.ArtifactRegistration{Record: schemas.ArtifactRecord{Name: "Bad Name"}}), schemas.CodeInvalidArtifact, "name"},
		{"rm unknown", jsonMsg(t, bus.SubjectArtifactRemove, schemas.ArtifactRemoval{Name: "llama", ArtifactVersion: "v9"}), schemas.CodeArtifactUnknown, "artifact_version"},
		{"rm bad version", jsonMsg(t, bus.SubjectArtifactRemove, schemas.ArtifactRemoval{Name: "llama", ArtifactVersion: "../x"}), schemas.CodeInvalidArtifact, "artifact_version"},
	} {
		rep, _ := requestRaw(t, f.conn.NC, c.msg.Subject, c.msg)
		if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != c.code || rep.Refusal.Field != c.field {
			t.Fatalf("%s: %+v %+v, want %s on %q", c.name, rep.OK, rep.Refusal, c.code, c.field)
		}
	}

	rep, _ = request(t, f.conn.NC, bus.SubjectArtifactRemove, codec.JSON, schemas.ArtifactRemoval{Name: "llama", ArtifactVersion: "v1"})
	if rep.Refusal != nil || rep.OK == nil || rep.OK.Version != "v1" {
		t.Fatalf("rm: %+v %+v", rep.OK, rep.Refusal)
	}
	left, err := f.cat.List(ctx, "llama")
	if err != nil || len(left) != 1 || left[0].Version != "v2" {
		t.Fatalf("after rm: %+v, %v", left, err)
	}
}

func jsonMsg(t *testing.T, subject string, v any) *nats.Msg {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: subject, Data: b}
}
