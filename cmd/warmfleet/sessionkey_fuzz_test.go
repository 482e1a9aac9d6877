package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzSessionKey: any session argument and --tenant is refused, or names a
// session key whose tenant is a tenant name and whose parts are valid; a
// tenant given both in the argument and by --tenant must agree. Seeds are
// in testdata/fuzz/FuzzSessionKey.
func FuzzSessionKey(f *testing.F) {
	f.Add("acme.chat-1", "", false)
	f.Add("chat-1", "team-a", true)
	f.Add("acme.chat-1", "team-a", true)
	f.Add("Bad_T.s1", "", false)
	f.Fuzz(func(t *testing.T, arg, tenant string, named bool) {
		t.Setenv("WARMFLEET_TENANT", "")
		g := &globals{}
		cmd := &cobra.Command{}
		cmd.Flags().StringVar(&g.tenant, "tenant", schemas.DefaultTenant, "")
		if named {
			if err := cmd.Flags().Set("tenant", tenant); err != nil {
				t.Fatal(err)
			}
		}
		k, err := sessionKey(cmd, g, arg)
		if err != nil {
			return
		}
		if !schemas.ValidTenant(k.Tenant) || k.Validate() != nil {
			t.Fatalf("%q (--tenant %q) accepted as %+v", arg, tenant, k)
		}
		if named && k.Tenant != tenant {
			t.Fatalf("%q with --tenant %q names tenant %q", arg, tenant, k.Tenant)
		}
		if !named && !strings.ContainsAny(arg, "./") && k.Tenant != schemas.DefaultTenant {
			t.Fatalf("%q alone names tenant %q, want the default", arg, k.Tenant)
		}
	})
}
