package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServe_MalformedRegistryAuthStops: `warmfleet serve --registry-auth`
// with a malformed file stops at start, before any NATS server or data
// dir exists, with the file's line and column and without the secret in
// it; a malformed helper flag stops it too.
func TestServe_MalformedRegistryAuthStops(t *testing.T) {
	const secret = "Quokka-Secret-51"
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	body := "{\n  \"auths\": {\n    \"registry.example.com\": {\"username\": \"ci\", \"password\": \"" + secret + "\",}\n  }\n}\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sources := filepath.Join(dir, "sources")
	if err := os.WriteFile(sources, []byte("# models\nhttps://models.example.com/ Bad Header: Bearer "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"auths": {"registry.example.com": {"username": "ci", "password": "`+secret+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--registry-auth", file}, file + ": line 3, column 79: not valid JSON"},
		{[]string{"--registry-credential-helper", "registry.example.com"}, "write HOST=NAME"},
		{[]string{"--registry-credential-helper", "registry.example.com=../bin/sh"}, "not a helper name"},
		{[]string{"--artifact-source-auth", sources}, sources + ": artifact source auth: line 2, column 29: a header name"},
		{[]string{"--artifact-source-auth", filepath.Join(dir, "absent")}, "--artifact-source-auth"},
		{[]string{"--credential-rate", "0"}, "--credential-rate/--credential-burst: a credential rate limit needs a positive rate"},
		{[]string{"--credential-burst", "0"}, "--credential-rate/--credential-burst"},
		{[]string{"--tenant-registry-auth", "team-a=" + file}, file + ": line 3, column 79: not valid JSON"},
		{[]string{"--tenant-registry-auth", file}, "write TENANT=PATH"},
		{[]string{"--tenant-registry-auth", "Team_A=" + file}, "invalid_tenant"},
		{[]string{"--tenant-registry-auth", "team-a=" + good, "--tenant-registry-auth", "team-a=" + good}, "given twice"},
	} {
		root := newRoot()
		root.SetArgs(append([]string{"serve", "--data-dir", dataDir, "--port", "-1"}, c.args...))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := root.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("serve %v: %v, want an error containing %q", c.args, err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the error quotes the secret: %v", err)
		}
		if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
			t.Fatalf("serve started (data dir exists: %v) before refusing its credentials", err)
		}
	}
}
