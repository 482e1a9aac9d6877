package noopruntime

import (
	"context"
	"errors"
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
