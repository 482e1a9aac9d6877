package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestProvidersFile: a providers file builds one connection per line, with
// its own limit and ownership token; a line with an unknown type, a
// missing credentials file, an unknown setting, a bad or repeated id or
// malformed JSON stops serve at start naming the file, the line and the
// field — and the error never carries a credential.
func TestProvidersFile(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "shadeform.key")
	if err := os.WriteFile(key, []byte("sk-secret-4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "providers.jsonl")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write(`# two connections
{"id": "east", "type": "fake", "max_rentals": 2, "settings": {"fake-seed": 7}}

{"id": "west", "type": "fake", "ownership_token": "wf-west"}
{"id": "sf", "type": "shadeform", "credentials_file": "` + key + `", "settings": {"shadeform-base-url": "http://127.0.0.1:1/v1"}}
{"id": "rp", "type": "runpod", "credentials_file": "` + key + `", "max_rentals": 1, "settings": {"runpod-image": "registry.example/agent:1", "runpod-base-url": "http://127.0.0.1:1/v1", "runpod-gpu-counts": [1, 2]}}
{"id": "rps", "type": "runpod-serverless", "credentials_file": "` + key + `", "endpoints": [{"id": "ep-1", "image": "registry.example/worker@sha256:` + strings.Repeat("a", 64) + `", "gpu_model": "A100", "gpu_count": 1, "usd_per_second": 0.00076}]}
`)
	c, cmd := newCapacityFlags(t, "--providers-file", good, "--max-rentals", "3")
	cc, lc, stop, err := c.build(context.Background(), cmd.Flags(), t.TempDir(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if lc == nil || len(lc.Connections) != 1 || lc.Connections[0].ID != "rps" {
		t.Fatalf("lane %+v: want the runpod-serverless connection", lc)
	}
	if len(cc.Connections) != 4 || cc.MaxRentals != 3 {
		t.Fatalf("connections %+v, max %d", cc.Connections, cc.MaxRentals)
	}
	east, west, sf := cc.Connections[0], cc.Connections[1], cc.Connections[2]
	if east.ID != "east" || east.MaxRentals != 2 || west.OwnershipToken != "wf-west" || sf.ID != "sf" || sf.Provider == nil {
		t.Fatalf("connections %+v", cc.Connections)
	}
	if err := sf.Provider.Verify(context.Background()); err == nil {
		t.Fatal("an unreachable connection verified; serve would not have skipped it")
	}

	for _, tc := range []struct {
		name, body, want string
	}{
		{"unknown type", `{"id": "a", "type": "fake"}` + "\n" + `{"id": "b", "type": "aws"}`, ":2: type: \"aws\" is not a provider type"},
		{"missing credentials file", `{"id": "sf", "type": "shadeform", "credentials_file": "/nonexistent/key"}`, ":1: credentials_file: "},
		{"no credentials file", `{"id": "sf", "type": "shadeform"}`, ":1: credentials_file: type shadeform needs"},
		{"runpod without an image", `{"id": "rp", "type": "runpod", "credentials_file": "` + key + `"}`, ":1: "},
		{"credentials for a type that takes none", `{"id": "f", "type": "fake", "credentials_file": "` + key + `"}`, ":1: credentials_file: type fake takes no credentials"},
		{"another type's setting", `{"id": "f", "type": "fake", "settings": {"shadeform-os": "x"}}`, ":1: settings.shadeform-os"},
		{"a key as a setting", `{"id": "s", "type": "shadeform", "credentials_file": "` + key + `", "settings": {"shadeform-api-key": "sk"}}`, ":1: settings.shadeform-api-key"},
		{"unknown setting", `{"id": "f", "type": "fake", "settings": {"fake-colour": 1}}`, ":1: settings.fake-colour"},
		{"bad setting value", `{"id": "f", "type": "fake", "settings": {"fake-seed": "many"}}`, ":1: settings.fake-seed"},
		{"repeated id", `{"id": "a", "type": "fake"}` + "\n# x\n" + `{"id": "a", "type": "fake"}`, ":3: id: \"a\" is already the connection of line 1"},
		{"bad id", `{"id": "a b", "type": "fake"}`, ":1: id"},
		{"unknown field", `{"id": "a", "type": "fake", "region": "x"}`, ":1: not a connection object"},
		{"two objects", `{"id": "a", "type": "fake"} {"id": "b", "type": "fake"}`, ":1: one connection object per line"},
		{"negative limit", `{"id": "a", "type": "fake", "max_rentals": -1}`, ":1: max_rentals"},
		{"empty", "# nothing\n", "no connections"},
		{"serverless without endpoints", `{"id": "s", "type": "runpod-serverless", "credentials_file": "` + key + `"}`, ":1: endpoints"},
		{"serverless endpoint unpinned", `{"id": "s", "type": "runpod-serverless", "credentials_file": "` + key + `", "endpoints": [{"id": "e", "image": "worker:latest"}]}`, ":1: endpoints[0].image"},
		{"endpoints on a machine provider", `{"id": "f", "type": "fake", "endpoints": [{"id": "e"}]}`, ":1: endpoints"},
		{"a limit on the lane", `{"id": "s", "type": "runpod-serverless", "credentials_file": "` + key + `", "max_rentals": 2, "endpoints": [{"id": "e", "image": "w@sha256:` + strings.Repeat("b", 64) + `"}]}`, ":1: max_rentals"},
	} {
		p := write(tc.body)
		c, cmd := newCapacityFlags(t, "--providers-file", p)
		_, _, _, err := c.build(context.Background(), cmd.Flags(), t.TempDir(), zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) && tc.name != "empty" {
			t.Errorf("%s: %v; want it to name %s and %q", tc.name, err, p, tc.want)
		}
		var pfe *ProvidersFileError
		if tc.name != "empty" && !errors.As(err, &pfe) {
			t.Errorf("%s: %T is not a ProvidersFileError", tc.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "sk-secret-4242") {
			t.Errorf("%s: the key is in the error", tc.name)
		}
	}
	c, cmd = newCapacityFlags(t, "--providers-file", good, "--provider", "fake")
	if _, _, _, err := c.build(context.Background(), cmd.Flags(), t.TempDir(), zap.NewNop()); err == nil || !strings.Contains(err.Error(), "give one") {
		t.Fatalf("--provider beside --providers-file: %v", err)
	}
}

// FuzzParseProviders: whatever a providers file holds, parsing answers a
// list of checked connections or a refusal, and never panics; a refusal
// at a line names a line of the file.
func FuzzParseProviders(f *testing.F) {
	f.Add([]byte(`{"id": "a", "type": "fake", "max_rentals": 2, "settings": {"fake-seed": 7}}`))
	f.Add([]byte("# c\n\n{\"id\": \"a\", \"type\": \"local\"}\n{\"id\": \"a\", \"type\": \"fake\"}\n"))
	f.Add([]byte(`{"id": "s", "type": "shadeform", "credentials_file": "/nonexistent"}`))
	f.Add([]byte(`{"id": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines, err := parseProviders("p.jsonl", data)
		var pfe *ProvidersFileError
		if errors.As(err, &pfe) && (pfe.Line < 1 || pfe.Line > strings.Count(string(data), "\n")+1) {
			t.Fatalf("refusal at line %d of a %d-line file", pfe.Line, strings.Count(string(data), "\n")+1)
		}
		for _, l := range lines {
			if l.ID == "" || !slices.Contains(providerTypes, l.Type) || l.MaxRentals < 0 {
				t.Fatalf("unchecked connection accepted: %+v", l)
			}
		}
	})
}

// TestServeStopsOnABadProvidersFile: serve refuses a providers file with an
// unknown type, or a missing credentials file, before it starts anything,
// naming the file's line.
func TestServeStopsOnABadProvidersFile(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"id": "a", "type": "fake"}` + "\n" + `{"id": "b", "type": "gcp"}`, ":2: type"},
		{"# ours\n" + `{"id": "sf", "type": "shadeform", "credentials_file": "/nonexistent/shadeform.key"}`, ":2: credentials_file"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "providers.jsonl")
		if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr syncBuffer
		err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, "serve", "--data-dir", filepath.Join(dir, "data"), "--port", "-1", "--providers-file", path)
		if err == nil || !strings.Contains(err.Error(), path+tc.want) {
			t.Fatalf("serve with %q: %v; want it to name %s%s", tc.body, err, path, tc.want)
		}
		if _, serr := os.Stat(filepath.Join(dir, "data")); serr == nil {
			t.Fatal("serve made its data directory before refusing the providers file")
		}
	}
}
