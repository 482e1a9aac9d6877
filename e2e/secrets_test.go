package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_SecretsNeverStored: with NATS auth and TLS on, a Run with
// a secret env var and a secret file, in real containerd, sees both values
// inside its container (it proves so by their sha256, printing neither);
// afterwards neither value, nor its base64, is in any KV value or history,
// any stream message (stored, or published while the test ran), any file
// under the agent's data dir or its runtime's state, any event, or any log
// line of the control plane, the agent or nats-server, all at debug level;
// the secret files' tmpfs is gone. A Run whose secret is removed before
// its launch fails secret_unavailable. Bad references are refused at
// intake, each with its code naming the field.
func TestAcceptance_SecretsNeverStored(t *testing.T) {
	w := newWorld(t)
	keyPath := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := secrets.EnsureKeyFile(keyPath); err != nil {
		t.Fatal(err)
	}
	sf := newSecureFleet(t, func(c *controlplane.Config) { c.SecretsKeyFile = keyPath })
	envValue, fileValue := "env-"+randomSecret(t), "file-"+randomSecret(t)+"\nsecond line\n"
	for name, v := range map[string]string{"secret env value": envValue, "secret file value": strings.TrimSuffix(fileValue, "\n")} {
		sf.plant(name, v)
		sf.plant(name+" (base64)", base64.StdEncoding.EncodeToString([]byte(v)))
		sf.plant(name+" (base64url)", base64.RawURLEncoding.EncodeToString([]byte(v)))
	}
	sf.plant("secret file value (base64 of the file)", base64.StdEncoding.EncodeToString([]byte(fileValue)))
	tap := sf.tapStreams()
	ctx := context.Background()
	store := sf.plane.Secrets()
	for name, v := range map[string]string{"api-token": envValue, "tls-key": fileValue} {
		if _, err := store.Set(ctx, schemas.DefaultTenant, name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// A Run whose secret is removed after intake, before any node could
	// launch it: its launch is refused the value and fails coded.
	if _, err := store.Set(ctx, schemas.DefaultTenant, "ephemeral", []byte(envValue)); err != nil {
		t.Fatal(err)
	}
	goneID := sf.submit(schemas.RunRequest{RequestID: "secrets-gone", Image: w.image.Reference, Command: []string{"true"},
		SecretEnv: []schemas.SecretEnvRef{{Name: "GONE", Secret: "ephemeral"}}})
	sf.eventually(30*time.Second, "the Run accepted", func() bool { _, ok := sf.run(goneID); return ok })
	if _, err := store.Remove(ctx, schemas.DefaultTenant, "ephemeral"); err != nil {
		t.Fatal(err)
	}
	a := sf.startContainerdAgent("node-a", w)
	if gone := sf.waitPhase(goneID, schemas.PhaseFailed, 90*time.Second); gone.Reason != string(schemas.CodeSecretUnavailable) {
		t.Fatalf("a Run whose secret went before its launch failed %q, want %s", gone.Reason, schemas.CodeSecretUnavailable)
	}

	hash := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	script := fmt.Sprintf(`e=$(printf %%s "$API_TOKEN" | sha256sum | cut -d' ' -f1); f=$(sha256sum < /run/secrets/tls.key | cut -d' ' -f1); `+
		`[ "$e" = %s ] && echo env-ok; [ "$f" = %s ] && echo file-ok; stat -c mode=%%a /run/secrets/tls.key; `+
		`(echo x > /run/secrets/tls.key) 2>/dev/null || echo read-only`, hash(envValue), hash(fileValue))
	runID := sf.submit(schemas.RunRequest{RequestID: "secrets-1", Image: w.image.Reference, Command: []string{"sh", "-c", script},
		SecretEnv:   []schemas.SecretEnvRef{{Name: "API_TOKEN", Secret: "api-token"}},
		SecretFiles: []schemas.SecretFileRef{{Secret: "tls-key", Path: "/run/secrets/tls.key"}}})
	run := sf.waitPhase(runID, schemas.PhaseSucceeded, 90*time.Second)
	sf.eventually(30*time.Second, "the run's stdout closed in WF_LOGS", func() bool {
		done, err := getLogEnd(sf.conn.JS, runID, bus.LogStdout)
		return done && err == nil
	})
	if out := runStdout(t, sf.conn.JS, runID); out != "env-ok\nfile-ok\nmode=400\nread-only\n" {
		t.Fatalf("the workload printed %q: it did not see both values, read-only with mode 0400", out)
	}
	// The tmpfs goes when the agent finishes the workload.
	stateDir := w.runtimeOptions(a.dataDir, nil).StateDir
	tmpfs := filepath.Join(stateDir, "secrets", run.AttemptID)
	sf.eventually(30*time.Second, "the secret files' tmpfs removed", func() bool {
		_, err := os.Stat(tmpfs)
		return errors.Is(err, fs.ErrNotExist)
	})
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), filepath.Join(stateDir, "secrets")+"/") {
		t.Fatalf("a secret tmpfs is still mounted under %s", stateDir)
	}

	// Bad references: each refused at intake, naming its field.
	bad := func(id string, edit func(*schemas.RunRequest)) string {
		r := schemas.RunRequest{RequestID: id, Image: w.image.Reference, Command: []string{"true"},
			SecretFiles: []schemas.SecretFileRef{{Secret: "tls-key", Path: "/run/secrets/k"}}}
		edit(&r)
		return sf.submit(r)
	}
	many := make([]schemas.SecretFileRef, schemas.MaxSecretRefs+1)
	for i := range many {
		many[i] = schemas.SecretFileRef{Secret: "tls-key", Path: fmt.Sprintf("/run/s/%d", i)}
	}
	for _, tc := range []struct {
		id    string
		edit  func(*schemas.RunRequest)
		code  schemas.Code
		field string
	}{
		{"bad-relative", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "run/secrets/k" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"bad-escape", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/run/../../etc/k" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"bad-proc", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/proc/self/k" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"bad-setuid", func(r *schemas.RunRequest) { r.SecretFiles[0].Mode = 0o4755 }, schemas.CodeInvalidSecretMode, "secret_files[0].mode"},
		{"bad-many", func(r *schemas.RunRequest) { r.SecretFiles = many }, schemas.CodeTooManyItems, "secret_files"},
		{"bad-unknown", func(r *schemas.RunRequest) {
			r.SecretEnv = []schemas.SecretEnvRef{{Name: "A", Secret: "api-token"}, {Name: "B", Secret: "no-such-secret"}}
		}, schemas.CodeSecretUnknown, "secret_env[1].secret"},
	} {
		id := bad(tc.id, tc.edit)
		var got schemas.RunEvent
		sf.eventually(30*time.Second, tc.id+" rejected", func() bool {
			for _, ev := range sf.events(id) {
				if ev.Type == schemas.EventRejected {
					got = ev
					return true
				}
			}
			return false
		})
		if got.Code != tc.code || got.Field != tc.field || got.Message == "" {
			t.Errorf("%s: rejected %s on %q (%s), want %s on %q", tc.id, got.Code, got.Field, got.Message, tc.code, tc.field)
		}
		if _, ok := sf.run(id); ok {
			t.Errorf("%s: a refused Run was stored", tc.id)
		}
	}

	// Canaries prove each search finds what it looks for.
	logCanary, fileCanary, stateCanary := randomSecret(t), randomSecret(t), randomSecret(t)
	sf.plant("log canary", logCanary)
	sf.plant("file canary", fileCanary)
	sf.plant("state canary", stateCanary)
	sf.log.Debug("canary", zap.String("value", logCanary))
	for dir, c := range map[string]string{a.dataDir: fileCanary, stateDir: stateCanary} {
		if err := os.WriteFile(filepath.Join(dir, "canary"), []byte("x"+c+"x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	values := map[string]string{}
	for name, v := range sf.secrets {
		if strings.HasPrefix(name, "secret ") || name == "file canary" || name == "state canary" {
			values[name] = v
		}
	}
	hits := append(sf.searchAtRest(tap), searchFiles(t, a.dataDir, values)...)
	hits = append(hits, searchTree(t, stateDir, values)...)
	for _, ev := range sf.allEvents() {
		b, _ := json.Marshal(ev)
		for name, v := range values {
			if strings.Contains(string(b), v) {
				hits = append(hits, fmt.Sprintf("event %s of %s holds the %s", ev.Type, ev.RunID, name))
			}
		}
	}
	canaries := map[string]bool{}
	for _, h := range hits {
		if c, ok := strings.CutPrefix(h[strings.LastIndex(h, " the ")+1:], "the "); ok && strings.HasSuffix(c, "canary") {
			canaries[c] = true
			continue
		}
		t.Error(h)
	}
	if len(canaries) != 3 {
		t.Fatalf("the searches found %d of the 3 canaries: %v", len(canaries), hits)
	}
	// The journal searched is the one that recorded the launch.
	if j, err := os.ReadFile(filepath.Join(a.dataDir, "operations.jsonl")); err != nil || !strings.Contains(string(j), run.AttemptID) {
		t.Fatalf("the agent's journal does not record the launch (%v)", err)
	}
}

// runStdout is the stdout of the first attempt of a Run of the default
// tenant as stored in WF_LOGS.
func runStdout(t *testing.T, js jetstream.JetStream, runID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, bus.StreamLogs, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.RunLogsSubject(schemas.DefaultTenant, runID)}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for left := info.NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Headers().Get(bus.HeaderLogStream) == bus.LogStdout {
			out.Write(m.Data())
		}
	}
	return out.String()
}

// searchTree returns one line per value found in a file under dir, which
// may hold few files (a runtime's state once its workloads are done): a
// canary planted there proves the walk.
func searchTree(t *testing.T, dir string, values map[string]string) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for name, v := range values {
			if strings.Contains(string(b), v) {
				hits = append(hits, fmt.Sprintf("file %s holds the %s", path, name))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}
