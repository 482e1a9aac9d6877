package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestServeSecretsKeyFile: with the embedded NATS the default key file is
// made (0600) and kept on the next start; with --nats-url a missing or
// loose one stops serve, saying how to make it.
func TestServeSecretsKeyFile(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	s := &serveSecrets{}
	path, err := s.build(true, dataDir, zap.NewNop())
	if err != nil || path != filepath.Join(dataDir, "secrets.key") {
		t.Fatalf("build = %q, %v", path, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v", st.Mode().Perm(), err)
	}
	first, _ := os.ReadFile(path)
	if _, err := s.build(true, dataDir, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(first) {
		t.Fatal("a second start replaced the key file")
	}
	// External NATS: the default must exist; it does here.
	if _, err := s.build(false, dataDir, zap.NewNop()); err != nil {
		t.Fatalf("external NATS with the key file present: %v", err)
	}
	other := &serveSecrets{keyFile: filepath.Join(t.TempDir(), "missing.key")}
	_, err = other.build(false, dataDir, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "--secrets-key-file") || !strings.Contains(err.Error(), "secret new-key") {
		t.Fatalf("external NATS without a key file: %v", err)
	}
	if _, err := os.Stat(other.keyFile); err == nil {
		t.Fatal("a key file was made for a replica")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.build(false, dataDir, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file others may read: %v", err)
	}
}
