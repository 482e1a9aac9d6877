package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_SecretKeyRotation: secrets set with the real CLI under a
// key K1; `secret new-key` puts K2 first and the control plane, reading the
// file again, seals with K2 and still opens K1's; `secret rotate-key`
// re-seals everything under K2; K1's line then leaves the file, the control
// plane restarts, and every secret still opens, with no value in wf_secrets
// in the clear at any revision.
func TestAcceptance_SecretKeyRotation(t *testing.T) {
	ctx := context.Background()
	keyPath := filepath.Join(t.TempDir(), "secrets.key")
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")
	cliDir := t.TempDir() // no operator login of another test's serve here
	var f *fleet
	wf := func(stdin string, args ...string) string {
		t.Helper()
		if f != nil {
			args = append([]string{"--nats-url", f.nats.URL()}, args...)
		}
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env, cmd.Stdin = cliDir, cleanEnv(), strings.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("warmfleet %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}

	// K1: the key file made by new-key, as an operator of --nats-url
	// replicas would.
	wf("", "secret", "new-key", "--key-file", keyPath)
	k1 := firstKeyID(t, keyPath)
	f = newFleet(t, func(c *controlplane.Config) {
		c.SecretsKeyFile = keyPath
		c.Tenants = []string{"default", "team-b"}
	})

	values := map[string]string{ // tenant/name -> value
		"default/HF_TOKEN":  "hf_k1_sealed_value\n",
		"team-b/DB_PASS":    "team-b-k1-password",
		"default/TLS_KEY":   "-----BEGIN KEY-----\nk1-file-value\n",
		"team-b/AFTER_NEW":  "sealed-under-k2-only",
		"default/AFTER_NEW": "default-after-new-key",
	}
	set := func(key string) {
		tenant, name, _ := strings.Cut(key, "/")
		if name == "TLS_KEY" {
			p := filepath.Join(t.TempDir(), "v")
			if err := os.WriteFile(p, []byte(values[key]), 0o600); err != nil {
				t.Fatal(err)
			}
			wf("", "--tenant", tenant, "secret", "set", name, "--from-file", p)
			return
		}
		wf(values[key], "--tenant", tenant, "secret", "set", name)
	}
	for _, k := range []string{"default/HF_TOKEN", "team-b/DB_PASS", "default/TLS_KEY"} {
		set(k)
	}
	wantKeys(t, wf, "default", map[string]string{"HF_TOKEN": k1, "TLS_KEY": k1})

	// K2 first in the file: new secrets are sealed with it, the old still
	// open with K1.
	wf("", "secret", "new-key", "--key-file", keyPath)
	k2 := firstKeyID(t, keyPath)
	if k2 == k1 {
		t.Fatal("new-key did not put a new key first")
	}
	set("team-b/AFTER_NEW")
	set("default/AFTER_NEW")
	wantKeys(t, wf, "team-b", map[string]string{"DB_PASS": k1, "AFTER_NEW": k2})
	openAll(t, f.plane.Secrets(), values)

	// rotate-key re-seals the three K1 secrets, across tenants.
	out := wf("", "-o", "json", "secret", "rotate-key")
	var rep schemas.RotateKeyReply
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("rotate-key -o json: %q: %v", out, err)
	}
	if rep.KeyID != k2 || rep.Resealed != 3 || rep.Current != 2 || rep.Failed != 0 {
		t.Fatalf("rotate-key = %+v, want 3 re-sealed and 2 current under %s", rep, k2)
	}
	wantKeys(t, wf, "default", map[string]string{"HF_TOKEN": k2, "TLS_KEY": k2, "AFTER_NEW": k2})

	// K1 leaves the file; the control plane restarts on it.
	dropKeyLine(t, keyPath, k1)
	f.cp.stop(t)
	f.cp = f.startCP()
	openAll(t, f.plane.Secrets(), values)
	wantKeys(t, wf, "team-b", map[string]string{"DB_PASS": k2, "AFTER_NEW": k2})

	// A store of our own over the new file alone opens every secret.
	keys, err := secrets.LoadKeyFile(keyPath, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if keys.Keyring().Has(k1) {
		t.Fatal("K1 still in the key file")
	}
	own, err := secrets.OpenStore(ctx, f.conn.JS, keys, []string{"default", "team-b"}, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	openAll(t, own, values)

	// No value, nor its base64, in wf_secrets at any revision.
	kv, err := f.conn.JS.KeyValue(ctx, bus.BucketSecrets)
	if err != nil {
		t.Fatal(err)
	}
	noValueInBucket(t, kv, values)
}

// firstKeyID is the id on the key file's first key line.
func firstKeyID(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			id, _, _ := strings.Cut(l, " ")
			return id
		}
	}
	t.Fatalf("%s holds no key", path)
	return ""
}

func dropKeyLine(t *testing.T, path, id string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(l, id+" ") {
			keep = append(keep, l)
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(keep, "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantKeys checks `secret list -o json` of tenant: exactly these names,
// each sealed under the key given, and no value in the output.
func wantKeys(t *testing.T, wf func(string, ...string) string, tenant string, want map[string]string) {
	t.Helper()
	out := wf("", "--tenant", tenant, "-o", "json", "secret", "list")
	var rep schemas.SecretListReply
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("secret list: %q: %v", out, err)
	}
	got := map[string]string{}
	for _, s := range rep.Secrets {
		got[s.Name] = s.KeyID
	}
	if rep.Tenant != tenant || len(got) != len(want) {
		t.Fatalf("tenant %s lists %v, want %v", tenant, got, want)
	}
	for n, k := range want {
		if got[n] != k {
			t.Fatalf("tenant %s: %s sealed under %q, want %q", tenant, n, got[n], k)
		}
	}
	if strings.Contains(out, "value") || strings.Contains(out, "sealed\"") {
		t.Fatalf("secret list shows more than names: %s", out)
	}
}

func openAll(t *testing.T, store *secrets.Store, values map[string]string) {
	t.Helper()
	if store == nil {
		t.Fatal("control plane has no secret store")
	}
	for key, want := range values {
		tenant, name, _ := strings.Cut(key, "/")
		v, err := store.Open(context.Background(), tenant, name)
		if err != nil || string(v) != want {
			t.Fatalf("open %s: %d bytes, %v", key, len(v), err)
		}
	}
}

// noValueInBucket fails if any revision of any key in kv holds a value or
// its base64.
func noValueInBucket(t *testing.T, kv jetstream.KeyValue, values map[string]string) {
	t.Helper()
	ctx := context.Background()
	l, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for k := range l.Keys() {
		h, err := kv.History(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h {
			n++
			for _, v := range values {
				if bytes.Contains(e.Value(), []byte(v)) || bytes.Contains(e.Value(), []byte(base64.StdEncoding.EncodeToString([]byte(v)))) {
					t.Fatalf("%s revision %d holds a value in the clear", k, e.Revision())
				}
			}
		}
	}
	if n < len(values) {
		t.Fatalf("wf_secrets holds %d revisions for %d secrets", n, len(values))
	}
}
