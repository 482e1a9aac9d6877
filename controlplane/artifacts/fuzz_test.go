package artifacts_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzDecodeRegistration: the register service's decoding (the request
// server's: codec.DecodeMsg, then Validate) never panics on any body; what
// it refuses is a coded refusal; what it accepts is a valid record. Seeds
// are in testdata/fuzz/FuzzDecodeRegistration.
func FuzzDecodeRegistration(f *testing.F) {
	f.Add([]byte(`{"record":{"name":"llama","version":"v1","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size_bytes":3,"source":{"object":"sha256/00"}}}`), false)
	f.Add([]byte{0x81, 0xa6, 'r', 'e', 'c', 'o', 'r', 'd', 0xc0}, true)
	f.Fuzz(func(t *testing.T, data []byte, msgpack bool) {
		h := nats.Header{}
		if msgpack {
			h.Set("Content-Type", "application/msgpack")
		}
		var reg schemas.ArtifactRegistration
		_, err := codec.DecodeMsg(&nats.Msg{Header: h, Data: data}, &reg)
		if err == nil {
			err = reg.Validate()
		}
		if err != nil {
			if ref := schemas.RefusalOfInput(err, "body is not an ArtifactRegistration"); ref.Code == "" || ref.Code == schemas.CodeInternal {
				t.Fatalf("error %v is not a coded refusal", err)
			}
			return
		}
		if err := reg.Record.Validate(); err != nil {
			t.Fatalf("accepted an invalid record: %v", err)
		}
		if !schemas.ValidTenant(reg.Record.TenantOf()) {
			t.Fatalf("accepted a record of tenant %q", reg.Record.Tenant)
		}
		if reg.Version < 0 || reg.Version > schemas.SchemaVersion {
			t.Fatalf("accepted version %d", reg.Version)
		}
	})
}
