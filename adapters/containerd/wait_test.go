package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

func (f *fixture) testStop(t *testing.T) {
	// SIGTERM goes to the container's init, which ignores signals it has no
	// handler for: plain sleep and an explicit trap both need the SIGKILL.
	for _, tc := range []struct{ name, script string }{
		{"SleepIgnoresTERM", "exec sleep 300"},
		{"TrapIgnoresTERM", "trap '' TERM; while true; do sleep 1; done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := "stop-" + tc.name
			f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: id, Command: []string{"sh", "-c", tc.script}})
			start := time.Now()
			if err := f.rt.Stop(testCtx(t), id, time.Second); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if took < time.Second || took > 10*time.Second {
				t.Errorf("Stop took %v, want grace (1s) then a kill", took)
			}
			st, err := f.rt.Inspect(testCtx(t), id)
			if err != nil || st.State != noderuntime.WorkloadExited || st.ExitCode != 137 {
				t.Fatalf("after Stop: %+v, %v; want exited by SIGKILL (137)", st, err)
			}
			if err := f.rt.Stop(testCtx(t), id, time.Second); err != nil {
				t.Fatalf("Stop of an exited workload: %v", err)
			}
		})
	}

	t.Run("HandlesTERM", func(t *testing.T) {
		t.Parallel()
		f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: "stop-handles", Command: []string{"sh", "-c", "trap 'exit 7' TERM; echo ready; while true; do sleep 0.1; done"}})
		waitForLog(t, f.rt, "stop-handles", "ready")
		start := time.Now()
		if err := f.rt.Stop(testCtx(t), "stop-handles", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("Stop took %v; SIGTERM should have ended it", took)
		}
		if st := wait(t, f.rt, "stop-handles"); st.ExitCode != 7 {
			t.Fatalf("exit %d, want 7 from the TERM trap", st.ExitCode)
		}
	})
}

func (f *fixture) testOOM(t *testing.T) {
	t.Parallel()
	// dd's 64 MiB buffer is touched by read(), so it is charged in full.
	f.launch(t, f.rt, noderuntime.WorkloadSpec{
		ID:          "oom",
		Command:     []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"},
		MemoryBytes: 16 << 20,
	})
	st := wait(t, f.rt, "oom")
	if !st.OOMKilled || st.ExitCode != 137 {
		t.Fatalf("Wait = %+v, want OOM-killed (137)", st)
	}
	// Both detectors work on their own: the cgroup counter...
	c, err := f.rt.client.LoadContainer(f.rt.ctx(testCtx(t)), "oom")
	if err != nil {
		t.Fatal(err)
	}
	if !f.rt.workloads.cgroupOOMKilled(f.rt.ctx(testCtx(t)), c) {
		t.Error("cgroup oom_kill counter did not show the kill")
	}
	// ...and the /tasks/oom event, which lands as a label.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := f.rt.client.LoadContainer(f.rt.ctx(testCtx(t)), "oom")
		if err != nil {
			t.Fatal(err)
		}
		labels, err := c.Labels(f.rt.ctx(testCtx(t)))
		if err != nil {
			t.Fatal(err)
		}
		if labels[labelOOMKilled] == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no OOM label recorded: %v", labels)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) testRestart(t *testing.T) {
	t.Parallel()
	first := f.newRuntime(t)
	// The workload exits 5 once the test has seen it running through the
	// second runtime (it creates /ctl/exit; at most two minutes), however
	// long the restart takes.
	ctl := t.TempDir()
	launched := f.launch(t, first, noderuntime.WorkloadSpec{ID: "restart", Mounts: []noderuntime.Mount{{Source: ctl, Target: "/ctl"}},
		Command: []string{"sh", "-c", "i=0; until [ -e /ctl/exit ] || [ $i -ge 120 ]; do sleep 1; i=$((i+1)); done; exit 5"}})
	if err := first.Close(); err != nil { // the agent goes away
		t.Fatal(err)
	}
	second := f.newRuntime(t)
	list, err := second.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range list {
		found = found || (w.ID == "restart" && w.State == noderuntime.WorkloadRunning)
	}
	if !found {
		t.Fatalf("List after restart = %+v, want restart running", list)
	}
	if err := os.WriteFile(filepath.Join(ctl, "exit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st := wait(t, second, "restart")
	if st.ExitCode != 5 || !st.StartedAt.Equal(launched.StartedAt.Truncate(0)) || st.FinishedAt.Before(st.StartedAt) {
		t.Fatalf("Wait after restart = %+v, launched %+v", st, launched)
	}
}

// waitForLog polls a workload's log until it contains s.
func waitForLog(t *testing.T, rt *Runtime, id, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := outputSoFar(rt, id)
		if strings.Contains(string(b), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log of %s never said %q: %q", id, s, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
