package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestNodePrune: `warmfleet node prune NODE --dry-run` lists what would go
// and removes nothing; without --dry-run it removes it; what a running Run
// uses is kept and says why; an unknown or silent node is refused.
func TestNodePrune(t *testing.T) {
	n := testenv.StartNATS(t)
	log := zap.NewNop()
	cpConn, err := bus.Connect(n.URL(), "cp", log)
	if err != nil {
		t.Fatal(err)
	}
	defer cpConn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, cpConn, controlplane.Config{HeartbeatInterval: time.Second, ReconcileInterval: 200 * time.Millisecond, OpenEnrollment: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Run(ctx) }()
	<-cp.Ready()

	idle, used := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	rt := noopruntime.New(noopruntime.Options{Images: []string{idle}})
	dataDir := t.TempDir()
	idleCache := filepath.Join(dataDir, "caches", "c-idle", "_")
	if err := os.MkdirAll(idleCache, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(idleCache, "data"), make([]byte, 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	agConn, err := bus.Connect(n.URL(), "node-1", log)
	if err != nil {
		t.Fatal(err)
	}
	defer agConn.Close()
	a, err := agent.New(agent.Config{NodeID: "node-1", Generation: 1, DataDir: dataDir, ContentRoot: dataDir}, agConn, rt, log)
	if err != nil {
		t.Fatal(err)
	}
	agDone := make(chan error, 1)
	go func() { agDone <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-agDone
		<-cpDone
	}()

	// A Run that runs on (the in-memory runtime never ends it) holds its
	// image and cache.
	req := schemas.RunRequest{RequestID: "prune-run", Image: "example.com/app@" + used, Command: []string{"sleep"},
		Caches: []schemas.CacheMount{{Name: "c-run", Path: "/cache"}}}
	b, _ := json.Marshal(req)
	if _, err := cpConn.JS.Publish(ctx, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), b); err != nil {
		t.Fatal(err)
	}
	runsKV, err := cpConn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the Run running", func() bool {
		var r schemas.Run
		_, err := bus.GetJSON(ctx, runsKV, schemas.RunIDFor(schemas.DefaultTenant, req.RequestID), &r)
		return err == nil && r.Phase == schemas.PhaseRunning
	})

	// The node declares what it can do; `node get` shows it.
	out, err := cli(t, n.URL(), "node", "get", "node-1")
	if err != nil || !strings.Contains(out, "exact image inventory, cache mounts, prewarm, no disk collection") {
		t.Errorf("node get: %v\n%s", err, out)
	}

	out, err = cli(t, n.URL(), "node", "prune", "node-1", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	for _, want := range []string{"node node-1: would remove 2 item(s)", idle, "c-idle", "2.0 KiB",
		"kept", used, "used by workload", "c-run", "mounted by workload"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if imgs, _ := rt.ImageUsage(ctx); len(imgs) != 2 {
		t.Fatalf("the dry run removed images: %+v", imgs)
	}
	if _, err := os.Stat(idleCache); err != nil {
		t.Fatalf("the dry run removed the idle cache: %v", err)
	}

	out, err = cli(t, n.URL(), "-o", "json", "node", "prune", "node-1")
	if err != nil {
		t.Fatalf("prune: %v\n%s", err, out)
	}
	var rep schemas.PruneReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("prune -o json: %v\n%s", err, out)
	}
	if rep.DryRun || len(rep.Removed) != 2 || rep.FreedBytes < 2048 || len(rep.Kept) != 2 {
		t.Fatalf("prune report %+v", rep)
	}
	imgs, _ := rt.ImageUsage(ctx)
	if len(imgs) != 1 || imgs[0].ManifestDigest != used {
		t.Fatalf("images after prune %+v, want only the running Run's", imgs)
	}
	if _, err := os.Stat(idleCache); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("idle cache still there after prune (err %v)", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "caches", "c-run", "_")); err != nil {
		t.Fatalf("the running Run's cache was removed: %v", err)
	}
	out, err = cli(t, n.URL(), "node", "prune", "node-1")
	if err != nil || !strings.Contains(out, "removed 0 item(s)") {
		t.Fatalf("second prune: %v\n%s", err, out)
	}

	// Bad input: unknown, silent and malformed nodes.
	if _, err := cli(t, n.URL(), "node", "prune", "nope"); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeUnknownNode}) {
		t.Errorf("prune of an unknown node: %v", err)
	}
	nodesKV, err := cpConn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	ghost, _ := json.Marshal(schemas.NodeRecord{NodeID: "ghost", State: schemas.NodeReady, FencingToken: 1, Generation: 1, LeaseExpires: time.Now().Add(-time.Minute)})
	if _, err := nodesKV.Create(ctx, "ghost", ghost); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a refusal of the silent node", func() bool {
		_, err := cli(t, n.URL(), "node", "prune", "ghost")
		return errors.Is(err, &schemas.Refusal{Code: schemas.CodeNodeNotLive})
	})
	if _, err := cli(t, n.URL(), "node", "prune", "bad/id"); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeMalformed}) {
		t.Errorf("prune of a malformed node id: %v", err)
	}
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
