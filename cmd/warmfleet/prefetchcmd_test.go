package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestPrefetchCommand: `warmfleet prefetch` against a real control plane
// and an agent (on the in-memory runtime, whose pull reports progress)
// prints the node's progress as it moves, then, once the node is ready, its
// locality for the image from its facts; `prefetch get` shows the record;
// a prefetch the node cannot finish in time exits with an error naming the
// node and why.
func TestPrefetchCommand(t *testing.T) {
	n := testenv.StartNATS(t)
	log := zap.NewNop()
	cpConn := testenv.Dial(t, n.URL(), "cp")
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, cpConn, controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Run(ctx) }()
	<-cp.Ready()
	agConn := testenv.Dial(t, n.URL(), "node-1")
	rt := noopruntime.New(noopruntime.Options{PullDelay: 2 * time.Second, PullBytes: 10 << 20})
	a, err := agent.New(agent.Config{NodeID: "node-1", Generation: 1, DataDir: t.TempDir(), ProgressInterval: 50 * time.Millisecond}, agConn, rt, log)
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
	for deadline := time.Now().Add(15 * time.Second); a.Enrollment().FencingToken == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("agent not enrolled")
		}
	}
	image := "registry.example/team/model@sha256:" + fmt.Sprintf("%064x", 1)

	out, err := cli(t, n.URL(), "prefetch", "--image", image, "--nodes", "node-1", "--request-id", "warm-1")
	if err != nil {
		t.Fatalf("prefetch: %v\n%s", err, out)
	}
	t.Logf("warmfleet prefetch:\n%s", out)
	id := schemas.PrefetchIDFor("warm-1")
	pulling := strings.Index(out, "node-1               pulling  ")
	ready := strings.Index(out, "node-1               ready")
	header := strings.Index(out, "NODE")
	platform := runtime.GOOS + "/" + runtime.GOARCH
	located := strings.Index(out, "hot       "+platform)
	if !strings.HasPrefix(out, "prefetch "+id+" of "+image+" on 1 node(s)\n") || pulling < 0 || !strings.Contains(out, " of 10.0 MiB (") ||
		ready < pulling || header < ready || located < header {
		t.Fatalf("want progress lines, then ready, then the node's locality:\n%s", out)
	}

	out, err = cli(t, n.URL(), "-o", "json", "prefetch", "get", id)
	if err != nil {
		t.Fatalf("get: %v\n%s", err, out)
	}
	var view prefetchView
	if err := json.Unmarshal([]byte(out), &view); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	if len(view.Nodes) != 1 || view.Nodes[0].State != schemas.PrefetchReady || view.Nodes[0].Locality != schemas.LocalityHot ||
		view.Prefetch.Node("node-1").Progress == nil || view.Prefetch.Node("node-1").Progress.DoneBytes != 10<<20 {
		t.Fatalf("get: %+v", view)
	}
	if _, err := cli(t, n.URL(), "prefetch", "get", "pf-nope"); err == nil || !strings.Contains(err.Error(), "no prefetch pf-nope") {
		t.Fatalf("get of an unknown prefetch: %v", err)
	}

	// Sent back at once with --no-wait; then a pull that outlasts its timeout.
	other := "registry.example/team/model@sha256:" + fmt.Sprintf("%064x", 2)
	out, err = cli(t, n.URL(), "prefetch", "--image", other, "--no-wait", "--request-id", "warm-2")
	if err != nil || !strings.Contains(out, "prefetch "+schemas.PrefetchIDFor("warm-2")+" of "+other+" sent to 1 node(s)") {
		t.Fatalf("--no-wait: %v\n%s", err, out)
	}
	slow := "registry.example/team/model@sha256:" + fmt.Sprintf("%064x", 3)
	out, err = cli(t, n.URL(), "prefetch", "--image", slow, "--timeout", "1s")
	if err == nil || !strings.Contains(err.Error(), "node node-1 failed: "+string(schemas.CodePrefetchTimedOut)) {
		t.Fatalf("a prefetch past its timeout: %v\n%s", err, out)
	}
	if _, err := cli(t, n.URL(), "prefetch", "--image", "registry.example/team/model:latest"); err == nil || !strings.Contains(err.Error(), string(schemas.CodeImageNotPinned)) {
		t.Fatalf("a tag: %v", err)
	}
	if _, err := cli(t, n.URL(), "prefetch", "--image", image, "--nodes", "colour=red"); err == nil || !strings.Contains(err.Error(), string(schemas.CodeInvalidSelector)) {
		t.Fatalf("a bad selector: %v", err)
	}
	if view.Prefetch.Tenant != schemas.DefaultTenant {
		t.Fatalf("a prefetch naming no tenant is recorded as %q's", view.Prefetch.Tenant)
	}
	if _, err := cli(t, n.URL(), "prefetch", "--image", image, "--tenant", "team-z"); err == nil || !strings.Contains(err.Error(), string(schemas.CodeTenantUnknown)) {
		t.Fatalf("a tenant this control plane lacks: %v", err)
	}
}

// TestPrefetchArtifactFlags: --artifact and --image exclude each other, one
// of them is required, and a malformed artifact is refused naming the flag
// and its code, all before the command dials NATS; a good one passes.
func TestPrefetchArtifactFlags(t *testing.T) {
	const nowhere = "nats://127.0.0.1:1"
	image := "registry.example/team/model@sha256:" + fmt.Sprintf("%064x", 1)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--image", image, "--artifact", "llama"}, []string{"--image and --artifact exclude each other"}},
		{[]string{"--nodes", "node-1"}, []string{"--image", "--artifact NAME[:VERSION|@sha256:<hex>]"}},
		{[]string{"--artifact", "Llama"}, []string{`--artifact "Llama"`, string(schemas.CodeInvalidArtifact)}},
		{[]string{"--artifact", "llama:v1@sha256:" + fmt.Sprintf("%064x", 1)}, []string{"--artifact", "not both"}},
		{[]string{"--artifact", "llama@sha256:beef"}, []string{"--artifact", string(schemas.CodeInvalidDigest)}},
		{[]string{"--image", "registry.example/m:latest"}, []string{"--image", string(schemas.CodeImageNotPinned)}},
		{[]string{"--image", image, "--tenant", "Team_A"}, []string{`--tenant "Team_A"`, string(schemas.CodeInvalidTenant)}},
	} {
		out, err := cli(t, nowhere, append([]string{"prefetch"}, c.args...)...)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v (want %q)\n%s", c.args, err, w, out)
			}
		}
	}
	for _, a := range []string{"llama", "llama:v1", "llama@sha256:" + fmt.Sprintf("%064x", 1)} {
		req := schemas.PrefetchRequest{RequestID: "r", Artifact: a, Count: 2}
		if err := checkPrefetchRequest(&req); err != nil {
			t.Errorf("--artifact %s: %v", a, err)
		}
	}
	help, err := cli(t, nowhere, "prefetch", "--help")
	if err != nil || !strings.Contains(help, "--artifact") || !strings.Contains(help, "NAME:VERSION") {
		t.Errorf("help does not describe --artifact: %v\n%s", err, help)
	}
}
