package containerd

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// testSecrets: a workload sees its secret env and files (read-only, with
// their mode); the files' tmpfs is mounted while its task lives and gone
// after Finish, Remove, a failed launch's undo, and a restart's sweep; no
// value is left in the runtime's state directory.
func (f *fixture) testSecrets(t *testing.T) {
	// Each workload's values are its own: a test looks for its own only.
	values := func(id string) (env, file []byte) {
		return []byte("env-secret-d41d8cd98f-" + id), []byte("file-secret-9e107d9d37-" + id + "\n")
	}
	spec := func(id string, cmd ...string) noderuntime.WorkloadSpec {
		envValue, fileValue := values(id)
		return noderuntime.WorkloadSpec{ID: id, Command: cmd,
			SecretEnv:   []schemas.SecretEnvValue{{Name: "API_TOKEN", Value: envValue}},
			SecretFiles: []schemas.SecretFileValue{{Path: "/run/secrets/key", Mode: 0o440, Value: fileValue}}}
	}
	t.Run("SeenInsideThenGone", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, spec("secrets-seen", "sh", "-c",
			`echo "env=$API_TOKEN"; cat /run/secrets/key; stat -c 'mode=%a' /run/secrets/key; echo x > /run/secrets/key 2>/dev/null || echo read-only`))
		wait(t, f.rt, "secrets-seen")
		dir := f.rt.workloads.secrets.dirOf("secrets-seen")
		if !mounted(t, dir) {
			t.Fatalf("no tmpfs at %s before Finish", dir)
		}
		if err := f.rt.Finish(testCtx(t), "secrets-seen"); err != nil {
			t.Fatal(err)
		}
		envValue, fileValue := values("secrets-seen")
		out, _ := os.ReadFile(nodelog.DataPath(f.rt.OutputDir("secrets-seen"), nodelog.Stdout))
		want := "env=" + string(envValue) + "\n" + string(fileValue) + "mode=440\nread-only\n"
		if string(out) != want {
			t.Fatalf("workload printed %q, want %q", out, want)
		}
		requireReleased(t, dir)
		requireNoValue(t, f.env.Dir+"/state", envValue, fileValue)
	})
	t.Run("RemovedWithContainer", func(t *testing.T) {
		t.Parallel()
		if _, err := f.rt.Launch(testCtx(t), f.withImage(spec("secrets-remove", "sleep", "600"))); err != nil {
			t.Fatal(err)
		}
		dir := f.rt.workloads.secrets.dirOf("secrets-remove")
		if !mounted(t, dir) {
			t.Fatalf("no tmpfs at %s while the workload runs", dir)
		}
		if err := f.rt.Remove(testCtx(t), "secrets-remove"); err != nil {
			t.Fatal(err)
		}
		requireReleased(t, dir)
	})
	t.Run("UndoneLaunch", func(t *testing.T) {
		t.Parallel()
		_, err := f.rt.Launch(testCtx(t), f.withImage(spec("secrets-undo", "/no/such/binary")))
		if err == nil {
			_ = f.rt.Remove(testCtx(t), "secrets-undo")
			t.Fatal("a launch of a missing binary started")
		}
		envValue, fileValue := values("secrets-undo")
		if strings.Contains(err.Error(), string(envValue)) || strings.Contains(err.Error(), strings.TrimSpace(string(fileValue))) {
			t.Fatalf("the launch error shows a value: %v", err)
		}
		requireReleased(t, f.rt.workloads.secrets.dirOf("secrets-undo"))
	})
	t.Run("SweptAtStart", func(t *testing.T) {
		// Not parallel: the new runtime's sweep would take a sibling's
		// files between their write and its container's creation (a
		// runtime's state directory is its own, never shared).
		// A predecessor died holding the files of a workload now gone.
		left := f.rt.workloads.secrets
		if _, err := left.write(spec("secrets-left", "true")); err != nil {
			t.Fatal(err)
		}
		if !mounted(t, left.dirOf("secrets-left")) {
			t.Fatal("no tmpfs written")
		}
		f.newRuntime(t)
		requireReleased(t, left.dirOf("secrets-left"))
	})
}

func (f *fixture) withImage(s noderuntime.WorkloadSpec) noderuntime.WorkloadSpec {
	s.ImageReference, s.ManifestDigest = f.image.Reference, f.image.ManifestDigest
	return s
}

// mounted reports whether dir is a mount point in this process's view.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(info), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

func requireReleased(t *testing.T, dir string) {
	t.Helper()
	if mounted(t, dir) {
		t.Fatalf("tmpfs still mounted at %s", dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("secret files directory %s still there: %v", dir, err)
	}
}

// requireNoValue fails if any file under root holds one of values.
func requireNoValue(t *testing.T, root string, values ...[]byte) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, v := range values {
			if bytes.Contains(b, bytes.TrimSpace(v)) {
				t.Errorf("%s holds a secret value", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
