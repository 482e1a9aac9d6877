package registryauth_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzParseConfig: any input is parsed or refused with a ConfigError whose
// line and column lie inside the input; invalid JSON is never accepted; an
// accepted file yields only canonical hosts and usable credentials.
// Seeds are in testdata/fuzz/FuzzParseConfig.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"auths":{"a.io":{"auth":"dTpw"}},"credHelpers":{"b.io":"ecr-login"},"credsStore":"pass"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := registryauth.ParseConfig(data)
		if err != nil {
			var ce *registryauth.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a ConfigError", err)
			}
			lines := 1 + bytes.Count(data, []byte{'\n'})
			if ce.Line < 1 || ce.Line > lines || ce.Column < 1 || ce.Column > len(data)+1 {
				t.Fatalf("position %d:%d outside %d lines of %d bytes", ce.Line, ce.Column, lines, len(data))
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		for host, c := range cfg.Auths {
			if schemas.CanonicalRegistry(host) != host {
				t.Fatalf("auths host %q is not canonical", host)
			}
			if (c.Username == "" || c.Password == "") && c.IdentityToken == "" {
				t.Fatalf("auths[%s] holds no usable credential", host)
			}
		}
		for host, h := range cfg.CredHelpers {
			if schemas.CanonicalRegistry(host) != host || h == "" {
				t.Fatalf("credHelpers[%q] = %q", host, h)
			}
		}
	})
}
