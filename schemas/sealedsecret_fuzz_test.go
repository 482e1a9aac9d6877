package schemas_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzSecretSetRequestDecode is wf.tenant.<t>.secret.set's body: it
// decodes and validates within its limits, or is refused by a code whose
// reason never holds the value.
func FuzzSecretSetRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.SecretSetRequest
		if err := codec.Decode(codec.Detect(fuzzHeader(contentType), body), body, &r); err == nil {
			if err := r.Validate(); err != nil && len(r.Value) >= 4 && strings.Contains(err.Error(), string(r.Value)) {
				t.Fatalf("refusal %v echoes the value", err)
			}
		}
		r = schemas.SecretSetRequest{}
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if !schemas.ValidSecretName(r.Name) || len(r.Value) == 0 || len(r.Value) > schemas.MaxSecretBytes {
			t.Fatalf("valid request out of bounds: name %q, %d bytes", r.Name, len(r.Value))
		}
		if s := fmt.Sprintf("%v %+v %#v", r, r, r); len(r.Value) >= 4 && strings.Contains(s, string(r.Value)) {
			t.Fatalf("formatting shows the value: %s", s)
		}
		reencode(t, &r)
	})
}

// FuzzSecretRemoveRequestDecode is wf.tenant.<t>.secret.rm's body.
func FuzzSecretRemoveRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.SecretRemoveRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if !schemas.ValidSecretName(r.Name) {
			t.Fatalf("valid removal of %q", r.Name)
		}
		reencode(t, &r)
	})
}

// FuzzSecretListRequestDecode is wf.tenant.<t>.secret.list's body and
// FuzzRotateKeyRequestDecode wf.admin.secret.rotate-key's.
func FuzzSecretListRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.SecretListRequest
		if decodeAndValidate(t, contentType, body, &r) {
			reencode(t, &r)
		}
	})
}

func FuzzRotateKeyRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.RotateKeyRequest
		if decodeAndValidate(t, contentType, body, &r) {
			reencode(t, &r)
		}
	})
}

// FuzzDecodeSealedSecret is a wf_secrets value read back: decoded within
// its limit and checked, or refused.
func FuzzDecodeSealedSecret(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := schemas.DecodeSealedSecret(data)
		if err != nil {
			if _, ok := err.(*schemas.Refusal); !ok && !errors.Is(err, codec.ErrMalformed) {
				t.Fatalf("error %T %v is neither a refusal nor malformed", err, err)
			}
			return
		}
		if len(data) > schemas.MaxSealedRecordBytes || len(s.Sealed) == 0 || len(s.Sealed) > schemas.MaxSealedSecretBytes ||
			!schemas.ValidTenant(s.Tenant) || !schemas.ValidSecretName(s.Name) || !schemas.ValidSecretKeyID(s.KeyID) {
			t.Fatalf("accepted record out of bounds: %+v", s.Info())
		}
		b, err := codec.Encode(codec.JSON, &s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := schemas.DecodeSealedSecret(b)
		if err != nil || !bytes.Equal(again.Sealed, s.Sealed) {
			t.Fatalf("re-encoded record: %v", err)
		}
	})
}
