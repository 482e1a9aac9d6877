package deploy_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/warmfleet/warmfleet/bus"
)

// TestNATSConfigsAreSecure: every shipped nats-server config parses, takes
// TLS only, sends every login but the control plane's to the auth callout,
// and, for the cluster, runs routes over mutual TLS with a route login that
// each route URL presents.
func TestNATSConfigsAreSecure(t *testing.T) {
	pki, err := bus.GenerateDevPKI(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARMFLEET_CP_NATS_PASSWORD", "test-password")
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	issuerPub, _ := issuer.PublicKey()
	files, _ := filepath.Glob("nats/*.conf")
	if len(files) == 0 {
		t.Fatal("no nats/*.conf")
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The certificate paths point at a throwaway CA's files (same
		// names), and the issuer placeholder becomes a real account key.
		conf := filepath.Join(t.TempDir(), filepath.Base(f))
		text := strings.NewReplacer("/etc/nats/tls/", filepath.Dir(pki.CAFile)+"/",
			"AREPLACE_WITH_THE_ISSUER_PUBLIC_KEY_XXXXXXXXXXXXXXXXXXXXXXXXXX", issuerPub).Replace(string(raw))
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if opts.TLSConfig == nil || opts.AllowNonTLS {
			t.Errorf("%s: clients are not TLS only", f)
		}
		if opts.AuthCallout == nil || len(opts.Users) != 1 || opts.Users[0].Username != "warmfleet-cp" {
			t.Errorf("%s: want the auth callout with warmfleet-cp its only user", f)
		}
		if len(opts.Routes) == 0 {
			continue
		}
		c := opts.Cluster
		if c.TLSConfig == nil || c.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("%s: routes are not mutual TLS", f)
		}
		if c.Username == "" || c.Password == "" {
			t.Errorf("%s: routes need no login", f)
		}
		for _, r := range opts.Routes {
			if p, _ := r.User.Password(); r.User == nil || r.User.Username() != c.Username || p != c.Password {
				t.Errorf("%s: route %s does not present the cluster's route login", f, r.Redacted())
			}
		}
	}
}
