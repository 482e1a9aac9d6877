package containerd

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/errdefs"

	"github.com/warmfleet/warmfleet/noderuntime"
)

func (f *fixture) testMounts(t *testing.T) {
	t.Run("WritableBindReachesHost", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "mount-rw", Command: []string{"sh", "-c", "echo from-container > /cache/sub/out"},
			Mounts: []noderuntime.Mount{{Source: dir, Target: "/cache/sub"}}})
		if st := wait(t, f.rt, "mount-rw"); st.ExitCode != 0 {
			t.Fatalf("workload exited %d", st.ExitCode)
		}
		b, err := os.ReadFile(filepath.Join(dir, "out"))
		if err != nil || string(b) != "from-container\n" {
			t.Fatalf("host sees %q (err %v), want the container's write", b, err)
		}
	})

	t.Run("ReadOnlyBindRefusesWrites", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "in"), []byte("seed"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Exit 7: could not read; 8: could write. Only 0 is right.
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "mount-ro",
			Command: []string{"sh", "-c", `test "$(cat /ro/in)" = seed || exit 7; touch /ro/new 2>/dev/null && exit 8; exit 0`},
			Mounts:  []noderuntime.Mount{{Source: dir, Target: "/ro", ReadOnly: true}}})
		if st := wait(t, f.rt, "mount-ro"); st.ExitCode != 0 {
			t.Fatalf("workload exited %d, want 0 (7: seed unreadable, 8: read-only mount was writable)", st.ExitCode)
		}
		if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
			t.Fatalf("a file appeared through a read-only mount (stat err %v)", err)
		}
	})

	t.Run("InvalidMountsRefusedBeforeCreate", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, m := range map[string]noderuntime.Mount{
			"relative-source": {Source: "rel/dir", Target: "/x"},
			"missing-source":  {Source: filepath.Join(dir, "missing"), Target: "/x"},
			"file-source":     {Source: file, Target: "/x"},
			"relative-target": {Source: dir, Target: "x"},
			"root-target":     {Source: dir, Target: "/"},
		} {
			id := "mount-bad-" + name
			_, err := f.rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: id, ImageReference: f.image.Reference,
				ManifestDigest: f.image.ManifestDigest, Command: []string{"true"}, Mounts: []noderuntime.Mount{m}})
			requireIs(t, err, ErrInvalidMount)
			if _, err := f.rt.client.LoadContainer(f.rt.ctx(testCtx(t)), id); !errdefs.IsNotFound(err) {
				t.Fatalf("%s: refused launch left a container (err %v)", name, err)
			}
		}
	})
}
