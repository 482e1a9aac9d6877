package noopruntime

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

const digest = "sha256:0000000000000000000000000000000000000000000000000000000000000001"

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	r := New(Options{})
	res, err := r.EnsureImage(ctx, noderuntime.ImageSpec{ManifestDigest: digest})
	if err != nil || res.AlreadyPresent {
		t.Fatalf("first ensure: %+v %v", res, err)
	}
	if res, _ := r.EnsureImage(ctx, noderuntime.ImageSpec{ManifestDigest: digest}); !res.AlreadyPresent {
		t.Fatal("second ensure should find the image present")
	}
	st, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: "w1", Labels: map[string]string{"k": "v"}})
	if err != nil || st.State != noderuntime.WorkloadRunning || st.StartedAt.IsZero() {
		t.Fatalf("launch: %+v %v", st, err)
	}
	if _, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: "w1"}); !errors.Is(err, noderuntime.ErrWorkloadExists) {
		t.Fatalf("relaunch: %v", err)
	}
	done := make(chan noderuntime.WorkloadStatus)
	go func() { st, _ := r.Wait(ctx, "w1"); done <- st }()
	if err := r.Stop(ctx, "w1", time.Second); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st.State != noderuntime.WorkloadExited || st.ExitCode != 143 || st.Labels["k"] != "v" {
		t.Fatalf("after stop: %+v", st)
	}
	if err := r.Stop(ctx, "w1", 0); err != nil {
		t.Fatalf("stopping an exited workload: %v", err)
	}
	if err := r.Remove(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Inspect(ctx, "w1"); !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		t.Fatalf("inspect removed: %v", err)
	}
	if err := r.Stop(ctx, "w1", 0); !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		t.Fatalf("stop removed: %v", err)
	}
	imgs, _ := r.Images(ctx)
	if len(imgs) != 1 || imgs[0].ManifestDigest != digest {
		t.Fatalf("images: %+v", imgs)
	}
}

func TestExitAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := New(Options{ExitAfter: 10 * time.Millisecond})
	if _, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: "w"}); err != nil {
		t.Fatal(err)
	}
	st, err := r.Wait(ctx, "w")
	if err != nil || st.State != noderuntime.WorkloadExited || st.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	list, _ := r.List(ctx)
	if len(list) != 1 {
		t.Fatalf("list: %+v", list)
	}
}

// TestBehaviourFromEnv: a workload's environment says when and how it ends,
// over the runtime's default; a malformed value fails the launch.
func TestBehaviourFromEnv(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := New(Options{ExitAfter: time.Hour})
	for _, c := range []struct {
		name string
		env  []string
		code int
		oom  bool
	}{
		{"exit code", []string{"NOOP_EXIT_AFTER=20ms", "NOOP_EXIT_CODE=3"}, 3, false},
		{"oom", []string{"NOOP_OOM=1", "NOOP_EXIT_AFTER=10ms"}, 137, true},
		{"oom on this node", []string{"NOOP_OOM_ON=a,b", "WARMFLEET_NODE_ID=b", "NOOP_EXIT_AFTER=10ms"}, 137, true},
		{"oom elsewhere", []string{"NOOP_OOM_ON=a", "WARMFLEET_NODE_ID=b", "NOOP_EXIT_AFTER=10ms"}, 0, false},
	} {
		t0 := time.Now()
		if _, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: c.name, Env: c.env}); err != nil {
			t.Fatalf("%s: launch: %v", c.name, err)
		}
		st, err := r.Wait(ctx, c.name)
		if err != nil || st.ExitCode != c.code || st.OOMKilled != c.oom {
			t.Errorf("%s: ended %+v (%v), want exit code %d, oom %v", c.name, st, err, c.code, c.oom)
		}
		if time.Since(t0) > 2*time.Second {
			t.Errorf("%s: took the runtime's default exit, not its own", c.name)
		}
	}
	for _, env := range []string{"NOOP_EXIT_AFTER=soon", "NOOP_EXIT_AFTER=-1s", "NOOP_EXIT_CODE=256", "NOOP_OOM=yes"} {
		if _, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: "bad-" + env, Env: []string{env}}); err == nil || !strings.Contains(err.Error(), strings.Split(env, "=")[0]) {
			t.Errorf("launch with %s: %v, want an error naming the variable", env, err)
		}
	}
	// Told how to end but not when, on a runtime with no default: at once.
	once := New(Options{})
	if _, err := once.Launch(ctx, noderuntime.WorkloadSpec{ID: "at-once", Env: []string{"NOOP_OOM=1"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := once.Wait(ctx, "at-once"); err != nil || !st.OOMKilled || st.ExitCode != 137 {
		t.Errorf("an OOM told no delay: %+v (%v), want killed at once", st, err)
	}
	// Told nothing, a workload keeps the runtime's default: it still runs.
	if _, err := r.Launch(ctx, noderuntime.WorkloadSpec{ID: "default"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.Inspect(ctx, "default"); st.State != noderuntime.WorkloadRunning {
		t.Errorf("a workload told nothing: %+v, want running", st)
	}
}
