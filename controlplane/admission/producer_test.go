package admission_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestParseProducerTokens(t *testing.T) {
	got, err := admission.ParseProducerTokens("# producers\n\nacme s3cret-acme\n  beta   s3cret-beta  team-b\ngamma s3cret-gamma default\n")
	want := map[string]admission.Producer{
		"acme":  {Token: "s3cret-acme", Tenant: schemas.DefaultTenant},
		"beta":  {Token: "s3cret-beta", Tenant: "team-b"},
		"gamma": {Token: "s3cret-gamma", Tenant: schemas.DefaultTenant},
	}
	if err != nil || len(got) != len(want) {
		t.Fatalf("ParseProducerTokens = %v, %v", got, err)
	}
	for name, p := range want {
		if got[name] != p {
			t.Errorf("producer %s = %+v, want %+v", name, got[name], p)
		}
	}
	if ts := admission.ProducerTenants(got); !slices.Equal(ts, []string{schemas.DefaultTenant, "team-b"}) {
		t.Errorf("ProducerTenants = %q, want default and team-b", ts)
	}
	if ts := admission.ProducerTenants(nil); !slices.Equal(ts, []string{schemas.DefaultTenant}) {
		t.Errorf("ProducerTenants of none = %q, want default alone", ts)
	}
	const secret = "Zq9-planted-secret"
	for _, bad := range []string{"acme", "acme a " + secret, "acme x\nacme " + secret, "a.b " + secret, "> " + secret, "* " + secret,
		"operator " + secret, "a/b " + secret, "acme " + secret + " Team", "acme " + secret + " a.b", "acme " + secret + " -x",
		"acme " + secret + " " + strings.Repeat("t", 33), "acme " + secret + " team extra"} {
		_, err := admission.ParseProducerTokens(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%q: the error echoes the token: %v", bad, err)
		}
	}
}

// FuzzParseProducerTokens is the operator's --producer-tokens-file: every
// accepted name is one subject token, since it becomes part of the
// producer's permissions, every tenant a valid tenant name (it becomes a
// subject token and a stream name), and no token is ever echoed in an
// error.
func FuzzParseProducerTokens(f *testing.F) {
	f.Add("acme tok-1\nbeta tok-2\n")
	f.Add("a.> tok")
	f.Add("acme tok-1 team-a\nbeta tok-2 team-b\n")
	f.Add("acme tok-1 A.>\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := admission.ParseProducerTokens(text)
		if err != nil {
			for _, line := range strings.Split(text, "\n") {
				if f := strings.Fields(line); len(f) >= 2 && len(f[1]) >= 8 && strings.Contains(err.Error(), f[1]) &&
					!strings.Contains(f[0], f[1]) && (len(f) < 3 || !strings.Contains(f[2], f[1])) {
					t.Fatalf("error %q echoes token %q", err, f[1])
				}
			}
			return
		}
		for name, p := range m {
			if !bus.SubjectToken(name) || name == bus.OperatorUser || p.Token == "" || !schemas.ValidTenant(p.Tenant) {
				t.Fatalf("accepted producer %q: %+v", name, p)
			}
		}
		ts := admission.ProducerTenants(m)
		if !slices.Contains(ts, schemas.DefaultTenant) || !slices.IsSorted(ts) {
			t.Fatalf("tenants %q", ts)
		}
	})
}
