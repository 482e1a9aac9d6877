package admission_test

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
)

func TestParseProducerTokens(t *testing.T) {
	got, err := admission.ParseProducerTokens("# producers\n\nacme s3cret-acme\n  beta   s3cret-beta  \n")
	if err != nil || len(got) != 2 || got["acme"] != "s3cret-acme" || got["beta"] != "s3cret-beta" {
		t.Fatalf("ParseProducerTokens = %v, %v", got, err)
	}
	const secret = "Zq9-planted-secret"
	for _, bad := range []string{"acme", "acme a " + secret, "acme x\nacme " + secret, "a.b " + secret, "> " + secret, "* " + secret, "operator " + secret, "a/b " + secret} {
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
// producer's permissions, and no token is ever echoed in an error.
func FuzzParseProducerTokens(f *testing.F) {
	f.Add("acme tok-1\nbeta tok-2\n")
	f.Add("a.> tok")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := admission.ParseProducerTokens(text)
		if err != nil {
			for _, line := range strings.Split(text, "\n") {
				if f := strings.Fields(line); len(f) == 2 && len(f[1]) >= 8 && strings.Contains(err.Error(), f[1]) && !strings.Contains(f[0], f[1]) {
					t.Fatalf("error %q echoes token %q", err, f[1])
				}
			}
			return
		}
		for name, tok := range m {
			if !bus.SubjectToken(name) || name == bus.OperatorUser || tok == "" {
				t.Fatalf("accepted producer %q", name)
			}
		}
	})
}
