package main

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestSecretFlags(t *testing.T) {
	env, err := secretEnvFlag("HF_TOKEN=hf-token")
	if err != nil || env != (schemas.SecretEnvRef{Name: "HF_TOKEN", Secret: "hf-token"}) {
		t.Fatalf("--secret-env: %+v, %v", env, err)
	}
	for _, c := range []struct {
		arg  string
		want schemas.SecretFileRef
	}{
		{"db-cert=/run/secrets/db.pem", schemas.SecretFileRef{Secret: "db-cert", Path: "/run/secrets/db.pem"}},
		{"db-cert=/run/secrets/db.pem:0440", schemas.SecretFileRef{Secret: "db-cert", Path: "/run/secrets/db.pem", Mode: 0o440}},
	} {
		got, err := secretFileFlag(c.arg)
		if err != nil || got != c.want {
			t.Fatalf("--secret-file %s: %+v, %v", c.arg, got, err)
		}
	}
	for _, bad := range []string{"", "=x", "NAME=", "NAME"} {
		if _, err := secretEnvFlag(bad); err == nil || !strings.Contains(err.Error(), "NAME=SECRET") {
			t.Errorf("--secret-env %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "s", "=/p", "s=", "s=/p:", "s=/p:9", "s=/p:rw"} {
		if _, err := secretFileFlag(bad); err == nil || !strings.Contains(err.Error(), "--secret-file") {
			t.Errorf("--secret-file %q: %v", bad, err)
		}
	}
	// The request's own validation names the field the flag filled.
	f := submitFlags{image: "example.com/x@sha256:" + strings.Repeat("a", 64), secretFiles: []string{"s=relative/path"}}
	if _, err := f.request(nil); err == nil || !strings.Contains(err.Error(), "secret_files[0].path") {
		t.Fatalf("a relative secret file path: %v", err)
	}
}

// FuzzSecretFlags: any flag value is read or refused, never a panic, and a
// value read gives back what it was given.
func FuzzSecretFlags(f *testing.F) {
	for _, s := range []string{"HF_TOKEN=hf-token", "db=/run/s/db:0440", "=", ":", "a=b:c:d", "s=/p:777777777777"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		if ref, err := secretEnvFlag(arg); err == nil && ref.Name+"="+ref.Secret != arg {
			t.Fatalf("--secret-env %q read as %+v", arg, ref)
		}
		if ref, err := secretFileFlag(arg); err == nil && (ref.Secret == "" || ref.Path == "" || !strings.HasPrefix(arg, ref.Secret+"=")) {
			t.Fatalf("--secret-file %q read as %+v", arg, ref)
		}
	})
}
