package secrets_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/controlplane/secrets"
)

// keyFile makes a fresh key file in a test directory.
func keyFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	created, err := secrets.EnsureKeyFile(path)
	if err != nil || !created {
		t.Fatalf("EnsureKeyFile: created=%v err=%v", created, err)
	}
	return path
}

func load(t *testing.T, path string) *secrets.KeyFile {
	t.Helper()
	kf, err := secrets.LoadKeyFile(path, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return kf
}

// keyLines are the key lines of a key file, comments left out.
func keyLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func TestEnsureKeyFileMakesOneKeyOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "secrets.key")
	created, err := secrets.EnsureKeyFile(path)
	if err != nil || !created {
		t.Fatalf("created=%v err=%v", created, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if n := len(keyLines(t, path)); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
	before, _ := os.ReadFile(path)
	if created, err := secrets.EnsureKeyFile(path); err != nil || created {
		t.Fatalf("second EnsureKeyFile: created=%v err=%v", created, err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("EnsureKeyFile changed an existing file")
	}
}

func TestSealOpenBoundToKeyTenantAndName(t *testing.T) {
	ring := load(t, keyFile(t)).Keyring()
	value := []byte("hunter2\n")
	id, sealed, err := ring.Seal("a", "db_password", value)
	if err != nil || id != ring.SealingKeyID() {
		t.Fatalf("Seal: id %q err %v", id, err)
	}
	if bytes.Contains(sealed, value[:7]) {
		t.Fatal("sealed value holds the plain value")
	}
	got, err := ring.Open(id, "a", "db_password", sealed)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	for _, c := range []struct{ tenant, name string }{{"b", "db_password"}, {"a", "other"}} {
		if _, err := ring.Open(id, c.tenant, c.name, sealed); !errors.Is(err, secrets.ErrBrokenSeal) {
			t.Fatalf("opened as %s/%s: %v", c.tenant, c.name, err)
		}
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	if _, err := ring.Open(id, "a", "db_password", tampered); !errors.Is(err, secrets.ErrBrokenSeal) {
		t.Fatalf("tampered value opened: %v", err)
	}
	if _, err := ring.Open(id, "a", "db_password", sealed[:10]); !errors.Is(err, secrets.ErrBrokenSeal) {
		t.Fatalf("short value: %v", err)
	}
	// Another file's key of the same id does not open it.
	other := keyFile(t)
	line := keyLines(t, other)[0]
	_, b64, _ := strings.Cut(line, " ")
	wrong, err := secrets.ParseKeyring([]byte(id + " " + b64 + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Open(id, "a", "db_password", sealed); !errors.Is(err, secrets.ErrBrokenSeal) {
		t.Fatalf("wrong key opened it: %v", err)
	}
	if _, err := load(t, other).Keyring().Open(id, "a", "db_password", sealed); !errors.Is(err, secrets.ErrUnknownKey) {
		t.Fatalf("keyring without the key: %v", err)
	}
}

// TestNewKeySealsOldKeyOpens: a prepended key seals from then on, the
// old one still opens, and the file is replaced owner-only.
func TestNewKeySealsOldKeyOpens(t *testing.T) {
	path := keyFile(t)
	kf := load(t, path)
	old := kf.Keyring()
	oldID, sealed, err := old.Seal("default", "tok", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	newID, err := secrets.NewKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if lines := keyLines(t, path); len(lines) != 2 || !strings.HasPrefix(lines[0], newID+" ") || !strings.HasPrefix(lines[1], oldID+" ") {
		t.Fatalf("key file after NewKey: %d lines, want %s then %s", len(lines), newID, oldID)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v after NewKey", st.Mode().Perm())
	}
	ring := kf.Keyring() // read again: the file changed
	if ring.SealingKeyID() != newID || !ring.Has(oldID) {
		t.Fatalf("keyring after NewKey seals with %q, keys %v", ring.SealingKeyID(), ring.KeyIDs())
	}
	if v, err := ring.Open(oldID, "default", "tok", sealed); err != nil || string(v) != "v1" {
		t.Fatalf("old key's value: %q, %v", v, err)
	}
	id, _, _ := ring.Seal("default", "tok", []byte("v2"))
	if id != newID {
		t.Fatalf("sealed under %q, want the new key %q", id, newID)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("NewKey left files beside the key file: %v", entries)
	}
}

// TestKeyFileBrokenKeepsOldKeyring: a key file rewritten into something
// that does not parse keeps the keys last read, logged without the key;
// fixed, it is read again.
func TestKeyFileBrokenKeepsOldKeyring(t *testing.T) {
	path := keyFile(t)
	core, logs := observer.New(zapcore.InfoLevel)
	kf, err := secrets.LoadKeyFile(path, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	first := kf.Keyring().SealingKeyID()
	good, _ := os.ReadFile(path)
	line := keyLines(t, path)[0]
	_, b64, _ := strings.Cut(line, " ")
	// A line whose key is cut short: the reason must not quote it.
	broken := "k2 " + b64[:20] + "\n" + string(good)
	if err := os.WriteFile(path, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	bump(t, path)
	if got := kf.Keyring().SealingKeyID(); got != first {
		t.Fatalf("broken file replaced the keyring: sealing key %q", got)
	}
	entries := logs.FilterMessageSnippet("does not load").All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines about the broken file, want 1: %v", len(entries), logs.All())
	}
	if text := fmt.Sprint(entries[0].ContextMap()); strings.Contains(text, b64[:20]) || !strings.Contains(text, "line 1") {
		t.Fatalf("log line %q: want the line number and no key material", text)
	}
	// Asked again without a change: not read (nor logged) again.
	kf.Keyring()
	if n := logs.FilterMessageSnippet("does not load").Len(); n != 1 {
		t.Fatalf("logged %d times", n)
	}
	// Loose permissions are refused too.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, good, 0o644); err != nil {
		t.Fatal(err)
	}
	bump(t, path)
	if _, err := secrets.LoadKeyFile(path, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("LoadKeyFile of a 0644 file: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := secrets.NewKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := kf.Keyring().SealingKeyID(); got != id {
		t.Fatalf("fixed file not read again: sealing key %q, want %q", got, id)
	}
}

// bump moves path's mtime on, so a change within one clock tick is seen.
func bump(t *testing.T, path string) {
	t.Helper()
	future := time.Now().Add(time.Duration(time.Now().UnixNano()%1000+1) * time.Millisecond)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
}

func TestParseKeyringRefusals(t *testing.T) {
	key := strings.Repeat("A", 43) + "="
	for name, c := range map[string]struct{ in, want string }{
		"empty":      {"# nothing\n\n", "holds no key"},
		"one field":  {"k1\n", "line 1"},
		"three":      {"k1 " + key + " x\n", "3 fields"},
		"bad id":     {"-k " + key + "\n", "key id"},
		"duplicate":  {"k1 " + key + "\nk1 " + key + "\n", "twice"},
		"not base64": {"k1 !!!\n", "base64"},
		"short key":  {"k1 QUFB\n", "base64 of 32"},
	} {
		_, err := secrets.ParseKeyring([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	ring, err := secrets.ParseKeyring([]byte("# c\n  k2 " + key + "  \nk1 " + key + "\n"))
	if err != nil || ring.SealingKeyID() != "k2" || len(ring.KeyIDs()) != 2 {
		t.Fatalf("ParseKeyring: %v %v", ring, err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
