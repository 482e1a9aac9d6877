package registryauth_test

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/registryauth"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestParseConfig(t *testing.T) {
	file := `{
  "auths": {
    "https://index.docker.io/v1/": {"auth": "` + b64("hubuser:hub:pass") + `"},
    "registry.example.com:5000": {"username": "ci", "password": "s3cret", "email": "ci@example.com"},
    "ghcr.io": {"identitytoken": "refresh-me"},
    "placeholder.example.com": {}
  },
  "credHelpers": {"123.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"},
  "credsStore": "pass",
  "proxies": {"default": {"httpProxy": "http://proxy:3128"}},
  "psFormat": "table {{.ID}}"
}`
	cfg, err := registryauth.ParseConfig([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]registryauth.StaticCredential{
		"docker.io":                 {Username: "hubuser", Password: "hub:pass"},
		"registry.example.com:5000": {Username: "ci", Password: "s3cret"},
		"ghcr.io":                   {IdentityToken: "refresh-me"},
	}
	if len(cfg.Auths) != len(want) {
		t.Fatalf("auths %v, want %v", keys(cfg.Auths), keys(want))
	}
	for host, c := range want {
		if cfg.Auths[host] != c {
			t.Errorf("auths[%s] = %+v, want %+v", host, cfg.Auths[host], c)
		}
	}
	if h := cfg.CredHelpers["123.dkr.ecr.us-east-1.amazonaws.com"]; h != "ecr-login" || len(cfg.CredHelpers) != 1 {
		t.Errorf("credHelpers %v", cfg.CredHelpers)
	}
	if cfg.CredsStore != "pass" {
		t.Errorf("credsStore %q", cfg.CredsStore)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestParseConfigErrors: every malformed file is refused with the line and
// column of the value at fault, the field, and never the secret in it.
func TestParseConfigErrors(t *testing.T) {
	const secret = "Zebra-Quartz-77"
	cases := []struct {
		name, file    string
		line, col     int
		field, reason string
	}{
		{"syntax", "{\n  \"auths\": {\n    \"a.io\": {\"auth\": \"x\",}\n  }\n}", 3, 26, "", "not valid JSON"},
		{"bad literal", "{\"credsStore\":\n  tru}", 2, 6, "", "not valid JSON"},
		{"control character", "{\"credsStore\": \"a\x01\"}", 1, 18, "", "not valid JSON"},
		{"cut short", "{\n  \"auths\": {\n", 3, 1, "", "cut short"},
		{"not an object", "[1, 2]", 1, 1, "", "one JSON object"},
		{"trailing", "{}\n{}", 2, 1, "", "after the top-level object"},
		{"auths not an object", "{\"auths\": \"" + secret + "\"}", 1, 11, "auths", "must be an object"},
		{"auth not base64", "{\"auths\": {\n\"a.io\": {\n  \"auth\": \"" + secret + "!\"}}}", 3, 11, "auths.a.io.auth", "not standard base64"},
		{"auth without colon", "{\"auths\": {\"a.io\": {\"auth\": \"" + b64(secret) + "\"}}}", 1, 29, "auths.a.io.auth", "user:password"},
		{"password without user", "{\"auths\": {\n\n  \"a.io\": {\"password\": \"" + secret + "\"}}}", 3, 3, "auths.a.io", "without a username"},
		{"user without password", "{\"auths\": {\"a.io\": {\"username\": \"u\"}}}", 1, 12, "auths.a.io", "without a password"},
		{"password not a string", "{\"auths\": {\"a.io\": {\"username\": \"u\", \"password\": 7}}}", 1, 50, "auths.a.io.password", "must be a string"},
		{"bad host", "{\"auths\": {\"not a host\": {}}}", 1, 12, "auths", "not a registry host"},
		{"same host twice", "{\"auths\": {\n\"https://index.docker.io/v1/\": {},\n\"docker.io\": {}}}", 3, 1, "auths", "also on line 2"},
		{"helper with a path", "{\"credHelpers\": {\"a.io\": \"../../bin/sh\"}}", 1, 26, "credHelpers.a.io", "credential helper"},
		{"store not a string", "{\"credsStore\": {\"a\": 1}}", 1, 16, "credsStore", "must be a string"},
	}
	for _, c := range cases {
		_, err := registryauth.ParseConfig([]byte(c.file))
		var ce *registryauth.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, registryauth.ErrMalformedConfig) {
			t.Errorf("%s: %v, want a ConfigError", c.name, err)
			continue
		}
		if ce.Line != c.line || ce.Column != c.col || ce.Field != c.field || !strings.Contains(ce.Reason, c.reason) {
			t.Errorf("%s: %d:%d %q %q, want %d:%d %q containing %q", c.name, ce.Line, ce.Column, ce.Field, ce.Reason, c.line, c.col, c.field, c.reason)
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), b64(secret)) {
			t.Errorf("%s: the error quotes the secret: %v", c.name, err)
		}
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte("{\n  \"auths\": {\n    \"a.io\": 5\n  }\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := registryauth.LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), path+": line 3, column 13: auths.a.io: must be an object") {
		t.Fatalf("%v", err)
	}
	if _, err := registryauth.LoadConfig(filepath.Join(t.TempDir(), "absent.json")); err == nil || errors.Is(err, registryauth.ErrMalformedConfig) {
		t.Fatalf("absent file: %v", err)
	}
}
