package main

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestCheckAuthTransport: --nats-auth is refused over a connection without
// TLS, naming the override, and admitted with a CA (file or the bootstrap's
// PEM), a tls:// URL, the override, or without auth.
func TestCheckAuthTransport(t *testing.T) {
	log := zap.NewNop()
	tlsRequired := &schemas.Refusal{Code: schemas.CodeTLSRequired, Field: "--nats-auth"}
	for _, url := range []string{"nats://cp:4222", "tls://a:4222,nats://b:4222"} {
		err := checkAuthTransport(true, false, url, bus.TLSFiles{}, log)
		if !errors.Is(err, tlsRequired) || !strings.Contains(err.Error(), "--insecure-auth-without-tls") {
			t.Errorf("auth over %s: %v; want %s naming the override", url, err, schemas.CodeTLSRequired)
		}
	}
	for name, c := range map[string]struct {
		auth, override bool
		url            string
		tls            bus.TLSFiles
	}{
		"no auth":        {false, false, "nats://cp:4222", bus.TLSFiles{}},
		"override":       {true, true, "nats://cp:4222", bus.TLSFiles{}},
		"tls url":        {true, false, "tls://a:4222,tls://b:4222", bus.TLSFiles{}},
		"ca file":        {true, false, "nats://cp:4222", bus.TLSFiles{CAFile: "/etc/warmfleet/ca.pem"}},
		"bootstrap's ca": {true, false, "nats://cp:4222", bus.TLSFiles{CAPEM: "-----BEGIN CERTIFICATE-----"}},
	} {
		if err := checkAuthTransport(c.auth, c.override, c.url, c.tls, log); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
