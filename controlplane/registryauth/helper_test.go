package registryauth_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/registryauth"
)

// installHelpers writes each script as docker-credential-<name> in a
// directory put first on PATH for the test.
func installHelpers(t *testing.T, scripts map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, registryauth.HelperBinary(name)), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

const helperSecret = "Helper-Secret-9f3a"

// TestHelperRunner runs real helper scripts: the protocol's answer is a
// credential; a failure, a hang, garbage or a flood is an error of its
// own kind that never holds what the helper printed, and a hang is killed
// with the processes it started.
func TestHelperRunner(t *testing.T) {
	dir := installHelpers(t, map[string]string{
		// The server URL arrives on stdin, without a newline.
		"good": `read -r url || true
[ "$1" = get ] || exit 3
printf '{"ServerURL":"%s","Username":"robot","Secret":"` + helperSecret + `"}' "$url"`,
		"hub":      `read -r url || true; [ "$url" = "https://index.docker.io/v1/" ] && printf '{"Username":"<token>","Secret":"` + helperSecret + `"}'`,
		"fails":    `echo "error: token ` + helperSecret + ` expired"; echo "` + helperSecret + `" >&2; exit 2`,
		"notfound": `echo "credentials not found in native keychain"; exit 1`,
		"hangs":    `echo "` + helperSecret + `"; sleep 300 & echo $! > "$(dirname "$0")/child.pid"; wait`,
		"garbage":  `echo "Username: robot, Secret: ` + helperSecret + `"`,
		"flood":    `while :; do echo "` + helperSecret + `"; done`,
		"nosecret": `printf '{"Username":"robot","Secret":""}'`,
	})
	r := registryauth.HelperRunner{Timeout: 2 * time.Second} // room for a loaded machine to run the quick helpers
	ctx := context.Background()

	c, err := r.Get(ctx, "good", "registry.example.com:5000")
	if err != nil || c != (registryauth.StaticCredential{Username: "robot", Password: helperSecret}) {
		t.Fatalf("good: %+v %v", c, err)
	}
	c, err = r.Get(ctx, "hub", "docker.io")
	if err != nil || c != (registryauth.StaticCredential{IdentityToken: helperSecret}) {
		t.Fatalf("hub identity token: %+v %v", c, err)
	}

	for _, tc := range []struct {
		name string
		want error
		says string
	}{
		{"fails", registryauth.ErrHelperFailed, "exited with status 2"},
		{"hangs", registryauth.ErrHelperTimedOut, "within 2s"},
		{"garbage", registryauth.ErrHelperOutput, "helper protocol"},
		{"flood", registryauth.ErrHelperOutput, "more than"},
		{"nosecret", registryauth.ErrHelperOutput, "no Secret"},
		{"absent", registryauth.ErrHelperFailed, "not on the control plane's PATH"},
	} {
		start := time.Now()
		_, err := r.Get(ctx, tc.name, "registry.example.com")
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.says)
			continue
		}
		if strings.Contains(err.Error(), helperSecret) {
			t.Errorf("%s: the error holds the helper's output: %v", tc.name, err)
		}
		if !strings.Contains(err.Error(), "docker-credential-"+tc.name) || !strings.Contains(err.Error(), "registry.example.com") {
			t.Errorf("%s: the error names neither the helper nor the registry: %v", tc.name, err)
		}
		if d := time.Since(start); d > 15*time.Second { // the timeout, not the helper, ended it
			t.Errorf("%s took %s", tc.name, d)
		}
	}
	// The hung helper's child went with it.
	b, err := os.ReadFile(filepath.Join(dir, "child.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hung helper's child %s outlived its timeout", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A helper that holds nothing for the registry means anonymous.
	src, err := registryauth.NewSource(nil, map[string]string{"registry.example.com": "notfound"}, r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := src.Lookup(ctx, registryauth.NoTenant, "registry.example.com")
	if err != nil || !got.Anonymous {
		t.Fatalf("not found: %v %v", got, err)
	}
	// A cancelled caller is not the helper's failure.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Get(cctx, "good", "a.io"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestSourceOrder: a flag's helper wins over the file's, the file's
// credHelpers over its auths, auths over credsStore, and a registry with
// no source is anonymous.
func TestSourceOrder(t *testing.T) {
	installHelpers(t, map[string]string{
		"flag":  `printf '{"Username":"from-flag","Secret":"s"}'`,
		"file":  `printf '{"Username":"from-file-helper","Secret":"s"}'`,
		"store": `read -r url; [ "$url" = other.io ] && printf '{"Username":"from-store","Secret":"s"}' && exit 0; echo "credentials not found in native keychain"; exit 1`,
	})
	file, err := registryauth.ParseConfig([]byte(`{
 "auths": {"a.io": {"auth": "` + b64("from-auths:s") + `"}, "b.io": {"auth": "` + b64("from-auths:s") + `"}, "c.io": {"identitytoken": "tok"}},
 "credHelpers": {"a.io": "file", "d.io": "file"},
 "credsStore": "store"}`))
	if err != nil {
		t.Fatal(err)
	}
	src, err := registryauth.NewSource(file, map[string]string{"https://A.io": "flag"}, registryauth.HelperRunner{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{"a.io": "from-flag", "d.io": "from-file-helper", "b.io": "from-auths", "other.io": "from-store"} {
		c, err := src.Lookup(context.Background(), registryauth.NoTenant, host)
		if err != nil || c.Username != want || c.Registry != host || c.Anonymous {
			t.Errorf("%s: %v %v, want %s", host, c, err, want)
		}
	}
	if c, err := src.Lookup(context.Background(), registryauth.NoTenant, "c.io"); err != nil || c.Username != "" || c.Secret != "tok" {
		t.Errorf("c.io: %v %v, want an identity token", c, err)
	}
	if c, err := src.Lookup(context.Background(), registryauth.NoTenant, "nothing.io"); err != nil || !c.Anonymous {
		t.Errorf("nothing.io: %v %v, want anonymous", c, err)
	}
	if got := src.Helpers(); strings.Join(got, ",") != "file,flag,store" {
		t.Errorf("helpers %v", got)
	}
	if _, err := registryauth.NewSource(nil, map[string]string{"a.io": "/bin/sh"}, registryauth.HelperRunner{}); err == nil {
		t.Error("a helper path was accepted")
	}
}
