package schemas_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestImageRefRegistry(t *testing.T) {
	const d = "@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	for ref, want := range map[string]string{
		"busybox" + d:                               "docker.io",
		"library/busybox" + d:                       "docker.io",
		"localhost/busybox" + d:                     "localhost",
		"localhost:5000/busybox" + d:                "localhost:5000",
		"127.0.0.1:5000/team/app:v1" + d:            "127.0.0.1:5000",
		"ghcr.io/org/app" + d:                       "ghcr.io",
		"123.dkr.ecr.us-east-1.amazonaws.com/x" + d: "123.dkr.ecr.us-east-1.amazonaws.com",
	} {
		r, err := schemas.ParseImageRef("image", ref)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Registry(); got != want {
			t.Errorf("Registry(%s) = %q, want %q", ref, got, want)
		}
	}
	for in, want := range map[string]string{
		"https://index.docker.io/v1/": "docker.io", "registry-1.docker.io": "docker.io", "http://127.0.0.1:5000/v2/": "127.0.0.1:5000",
		"GHCR.io": "ghcr.io", " a.io ": "a.io",
	} {
		if got := schemas.CanonicalRegistry(in); got != want {
			t.Errorf("CanonicalRegistry(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRegistryCredentialNeverPrinted: however a credential is formatted,
// its secret stays out.
func TestRegistryCredentialNeverPrinted(t *testing.T) {
	const secret = "Printed-Secret-77"
	for _, c := range []schemas.RegistryCredential{
		{Registry: "a.io", Username: "u", Secret: secret},
		{Registry: "a.io", Secret: secret},
	} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			if out := fmt.Sprintf(verb, c); strings.Contains(out, secret) || !strings.Contains(out, "a.io") {
				t.Errorf("%s: %s", verb, out)
			}
		}
		if out := fmt.Sprintf("%v", &c); strings.Contains(out, secret) {
			t.Errorf("pointer: %s", out)
		}
	}
}
