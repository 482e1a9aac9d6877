package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestFindOperatorLoginOrder: the CLI takes the first directory holding an
// operator login (make run's data dir before the unit's), skips directories
// without one, and refuses a login file others may read.
func TestFindOperatorLoginOrder(t *testing.T) {
	local, system := t.TempDir(), t.TempDir()
	dirs := []string{local, system}
	if _, path, err := findOperatorLogin(dirs); err != nil || path != "" {
		t.Fatalf("no file anywhere: %q, %v; want none", path, err)
	}
	write := func(dir, url string) string {
		p := filepath.Join(dir, bus.OperatorContextFile)
		if err := bus.WriteOperatorContext(p, bus.OperatorContext{URL: url, User: bus.OperatorUser, Password: "secret-" + url}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sysPath := write(system, "tls://system:4222")
	if c, path, err := findOperatorLogin(dirs); err != nil || path != sysPath || c.URL != "tls://system:4222" {
		t.Fatalf("only the system dir: %q %q, %v", path, c.URL, err)
	}
	localPath := write(local, "tls://local:4222")
	if st, _ := os.Stat(localPath); st.Mode().Perm() != 0o600 {
		t.Fatalf("written with mode %v, want 0600", st.Mode().Perm())
	}
	if c, path, err := findOperatorLogin(dirs); err != nil || path != localPath || c.URL != "tls://local:4222" {
		t.Fatalf("both: %q %q, %v; want the local one first", path, c.URL, err)
	}
	if err := os.Chmod(localPath, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := findOperatorLogin(dirs)
	if !errors.Is(err, bus.ErrOperatorContext) || !strings.Contains(err.Error(), "chmod 600") || strings.Contains(err.Error(), "secret-") {
		t.Fatalf("a world-readable login: %v; want a refusal naming chmod 600, without the token", err)
	}
}

// TestServeRefusesOpenListen: serve on a non-loopback address without
// --auth stops before anything starts, naming --auth and the override.
func TestServeRefusesOpenListen(t *testing.T) {
	for _, listen := range []string{"0.0.0.0", "10.1.2.3", "::"} {
		root := newRoot()
		root.SetArgs([]string{"serve", "--listen", listen, "--data-dir", t.TempDir(), "--port", "-1"})
		err := root.Execute()
		if !errors.Is(err, &schemas.Refusal{Code: schemas.CodeAuthRequired, Field: "--auth"}) || !strings.Contains(err.Error(), "--insecure-no-auth") {
			t.Fatalf("serve --listen %s without --auth: %v; want %s naming --auth and --insecure-no-auth", listen, err, schemas.CodeAuthRequired)
		}
	}
	for _, listen := range []string{"127.0.0.1", "127.0.0.2", "::1", "localhost"} {
		if !isLoopback(listen) {
			t.Errorf("%s: not taken for loopback", listen)
		}
	}
}
