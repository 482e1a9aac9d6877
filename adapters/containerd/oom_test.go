package containerd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOOMKillCount(t *testing.T) {
	write := func(t *testing.T, p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		write(t, filepath.Join(root, "memory/ns/id/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
		n, err := oomKillCount(root, "/ns/id")
		if err != nil || n != 2 {
			t.Fatalf("got %d, %v; want 2", n, err)
		}
	})
	t.Run("v2", func(t *testing.T) {
		root := t.TempDir()
		write(t, filepath.Join(root, "cgroup.controllers"), "memory pids\n")
		write(t, filepath.Join(root, "ns/id/memory.events"), "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n")
		n, err := oomKillCount(root, "/ns/id")
		if err != nil || n != 1 {
			t.Fatalf("got %d, %v; want 1", n, err)
		}
	})
	t.Run("systemd path refused", func(t *testing.T) {
		if _, err := oomKillCount(t.TempDir(), "system.slice:wf:id"); err == nil {
			t.Fatal("systemd-style path accepted")
		}
	})
	t.Run("gone", func(t *testing.T) {
		if _, err := oomKillCount(t.TempDir(), "/ns/id"); err == nil {
			t.Fatal("missing cgroup gave a count")
		}
	})
}
