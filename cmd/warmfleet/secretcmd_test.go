package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestReadSecretValue: a value is kept byte for byte, from stdin or a
// file; an empty or oversized one is refused naming the value, without
// echoing it.
func TestReadSecretValue(t *testing.T) {
	v, err := readSecretValue(strings.NewReader("tok\n"), "")
	if err != nil || string(v) != "tok\n" {
		t.Fatalf("stdin: %q, %v", v, err)
	}
	path := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(path, []byte{0, 1, 2, '\n', '\n'}, 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := readSecretValue(strings.NewReader("ignored"), path); err != nil || !bytes.Equal(v, []byte{0, 1, 2, '\n', '\n'}) {
		t.Fatalf("file: %q, %v", v, err)
	}
	var r *schemas.Refusal
	if _, err := readSecretValue(strings.NewReader(""), ""); !errors.As(err, &r) || r.Code != schemas.CodeMissingField || r.Field != "value" {
		t.Fatalf("empty: %v", err)
	}
	big := strings.Repeat("z", schemas.MaxSecretBytes+1)
	_, err = readSecretValue(strings.NewReader(big), "")
	if !errors.As(err, &r) || r.Code != schemas.CodeSecretTooLarge || r.Field != "value" || strings.Contains(err.Error(), "zzzz") {
		t.Fatalf("too large: %v", err)
	}
	if _, err := readSecretValue(nil, filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--from-file") {
		t.Fatalf("missing file: %v", err)
	}
}

// TestSecretCommandsRefuseBeforeSending: a bad NAME, a value as an
// argument, a bad tenant and new-key without --key-file are refused
// naming what to fix, before any connection.
func TestSecretCommandsRefuseBeforeSending(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"secret", "set", "a.b"}, "NAME: invalid_secret_name"},
		{[]string{"secret", "set", "NAME", "the-value"}, "accepts 1 arg"},
		{[]string{"secret", "rm", "bad name"}, "NAME: invalid_secret_name"},
		{[]string{"--tenant", "Bad", "secret", "list"}, "--tenant: invalid_tenant"},
		{[]string{"secret", "new-key"}, "--key-file is required"},
	} {
		root := newRoot()
		root.SetArgs(append(c.args, "--nats-url", "nats://127.0.0.1:1"))
		root.SetIn(strings.NewReader("v"))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestSecretNewKeyCommand: new-key creates a missing file, then prepends.
func TestSecretNewKeyCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	for i, want := range []string{"created", "added first"} {
		root := newRoot()
		root.SetArgs([]string{"secret", "new-key", "--key-file", path})
		var out bytes.Buffer
		root.SetOut(&out)
		if err := root.Execute(); err != nil || !strings.Contains(out.String(), want) {
			t.Fatalf("run %d: %q, %v", i, out.String(), err)
		}
	}
	b, _ := os.ReadFile(path)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d keys after two new-key runs", n)
	}
}
