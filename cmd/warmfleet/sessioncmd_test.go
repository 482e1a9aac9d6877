package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/nodehost"
	"github.com/warmfleet/warmfleet/schemas"
)

// cli runs one warmfleet command line against url and returns its output.
func cli(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--nats-url", url}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

// TestSessionCommands: `warmfleet session attach|list|get|release` and
// `warmfleet node drain` against a real control plane and an agent hosting
// sessions (on the in-memory runtime).
func TestSessionCommands(t *testing.T) {
	n := testenv.StartNATS(t)
	log := zap.NewNop()
	cpConn, err := bus.Connect(n.URL(), "cp", log)
	if err != nil {
		t.Fatal(err)
	}
	defer cpConn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, cpConn, controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true, Tenants: []string{"acme", schemas.DefaultTenant, "other"},
		Sessions: sessions.Config{LeaseTTL: 3 * time.Second}}, log)
	if err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Run(ctx) }()
	<-cp.Ready()

	dataDir := t.TempDir()
	host, err := nodehost.New(nodehost.Options{Capacity: 4, WorkspaceRoot: filepath.Join(dataDir, "sessions"),
		Target: residency.RuntimeTarget{Image: "example.com/s@sha256:" + strings.Repeat("a", 64), ManifestDigest: "sha256:" + strings.Repeat("a", 64), CompatibilityID: "b1"}})
	if err != nil {
		t.Fatal(err)
	}
	agConn, err := bus.Connect(n.URL(), "node-1", log)
	if err != nil {
		t.Fatal(err)
	}
	defer agConn.Close()
	a, err := agent.New(agent.Config{NodeID: "node-1", Generation: 1, DataDir: dataDir, Sessions: host}, agConn, noopruntime.New(noopruntime.Options{}), log)
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
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, _ := json.Marshal(schemas.SessionCommand{FencingToken: a.Enrollment().FencingToken})
		resp, err := cpConn.NC.Request(bus.NodeSessions("node-1", string(schemas.SessionList)), b, time.Second)
		var rep schemas.SessionReply
		if err == nil && json.Unmarshal(resp.Data, &rep) == nil && rep.Error == nil {
			break // enrolled, and its session host answers
		}
		if time.Now().After(deadline) {
			t.Fatal("agent's session host not answering")
		}
		time.Sleep(50 * time.Millisecond)
	}

	out, err := cli(t, n.URL(), "session", "attach", "acme.s1")
	if err != nil || !strings.Contains(out, "session acme.s1 attached on node-1 at epoch 1") {
		t.Fatalf("attach: %v\n%s", err, out)
	}
	if _, err := cli(t, n.URL(), "session", "attach", "acme.s2", "--node", "node-1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"session", "attach", "bad!"}, "allowed are letters"},
		{[]string{"session", "attach", "Bad_T.s1"}, string(schemas.CodeInvalidTenant)},
		{[]string{"--tenant", "Bad_T", "session", "attach", "s1"}, string(schemas.CodeInvalidTenant)},
		{[]string{"--tenant", "other", "session", "get", "acme.s1"}, "but --tenant (or WARMFLEET_TENANT) says other"},
		{[]string{"--tenant", "Bad_T", "session", "list"}, string(schemas.CodeInvalidTenant)},
	} {
		if out, err := cli(t, n.URL(), c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v, want an error with %q\n%s", c.args, err, c.want, out)
		}
	}
	// A session named alone is --tenant's.
	if out, err := cli(t, n.URL(), "--tenant", "other", "session", "attach", "s3", "--node", "node-1"); err != nil || !strings.Contains(out, "session other.s3 attached") {
		t.Fatalf("attach in --tenant's tenant: %v\n%s", err, out)
	}
	if out, err := cli(t, n.URL(), "--tenant", "other", "session", "list"); err != nil || !strings.Contains(out, "other.s3") || strings.Contains(out, "acme.") {
		t.Fatalf("list of one tenant: %v\n%s", err, out)
	}
	if out, err := cli(t, n.URL(), "--tenant", "other", "session", "release", "s3"); err != nil || !strings.Contains(out, "released") {
		t.Fatalf("release in --tenant's tenant: %v\n%s", err, out)
	}
	out, err = cli(t, n.URL(), "session", "list")
	if err != nil || !strings.Contains(out, "SESSION") || !strings.Contains(out, "acme.s1") || !strings.Contains(out, "acme.s2") ||
		!strings.Contains(out, "resident") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, err = cli(t, n.URL(), "-o", "json", "session", "get", "acme.s1")
	if err != nil {
		t.Fatalf("get: %v\n%s", err, out)
	}
	var row sessionRow
	if err := json.Unmarshal([]byte(out), &row); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	if row.Route == nil || row.Route.Host != "node-1" || row.Route.Epoch != 1 || !row.LeaseLive || row.State == nil || row.State.CompatibilityID != "b1" {
		t.Fatalf("get: %+v", row)
	}
	if out, err := cli(t, n.URL(), "session", "release", "acme.s1"); err != nil || !strings.Contains(out, "released") {
		t.Fatalf("release: %v\n%s", err, out)
	}
	// The release checkpointed the session's workspace; get says so.
	if out, err := cli(t, n.URL(), "session", "get", "acme.s1"); err != nil || !strings.Contains(out, "Workspace:") || !strings.Contains(out, " files, ") || !strings.Contains(out, " sent)") {
		t.Fatalf("get after release shows no workspace checkpoint: %v\n%s", err, out)
	}
	if out, err := cli(t, n.URL(), "session", "release", "acme.s1"); err == nil || !strings.Contains(err.Error(), string(residency.CodeNotResident)) {
		t.Fatalf("second release: %v\n%s", err, out)
	}
	out, err = cli(t, n.URL(), "node", "drain", "node-1")
	if err != nil || !strings.Contains(out, "node node-1 is draining") || !strings.Contains(out, "session acme.s2 released") {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	out, err = cli(t, n.URL(), "session", "list")
	if err != nil || strings.Contains(out, "acme.s") {
		t.Fatalf("list after drain shows sessions: %v\n%s", err, out)
	}
	out, err = cli(t, n.URL(), "session", "list", "--all")
	if err != nil || !strings.Contains(out, "acme.s1") || !strings.Contains(out, "expired") {
		t.Fatalf("list --all: %v\n%s", err, out)
	}
}

func TestSessionEventText(t *testing.T) {
	taken := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		ev   schemas.SessionEvent
		want string
	}{
		{schemas.SessionEvent{Type: schemas.SessionAttached}, "no checkpoint restored (empty workspace)"},
		{schemas.SessionEvent{Type: schemas.SessionAttached, Restored: &schemas.RestoredCheckpoint{Sequence: 4, Epoch: 2, TakenAt: taken}},
			"restored checkpoint 4 (epoch 2), taken 2026-12-07T12:00:00Z"},
		{schemas.SessionEvent{Type: schemas.SessionAttached, Restored: &schemas.RestoredCheckpoint{Sequence: 3, Epoch: 2}}, "restored checkpoint 3 (epoch 2)"},
		{schemas.SessionEvent{Type: schemas.SessionCheckpointed, Sequence: 0}, "checkpoint 0 (no workspace)"},
		{schemas.SessionEvent{Type: schemas.SessionCheckpointed, Sequence: 5, Checkpoint: &schemas.CheckpointSummary{TakenAt: taken, Files: 2, Bytes: 3 << 20, BytesMoved: 1024, Seconds: 0.5}},
			"checkpoint 5: 2 files, 3.0 MiB, taken 2026-12-07T12:00:00Z in 0.5s (1.0 KiB sent)"},
	} {
		if got := sessionEventText(c.ev); got != c.want {
			t.Errorf("sessionEventText(%+v) = %q, want %q", c.ev, got, c.want)
		}
	}
}

func TestKeptText(t *testing.T) {
	got := keptText([]schemas.CheckpointRef{{Sequence: 5, Epoch: 2}, {Sequence: 6, Epoch: 2}, {Sequence: 7, Epoch: 3}})
	if got != "7, 6, 5" {
		t.Errorf("keptText = %q, want newest first", got)
	}
}

func TestWorkspaceText(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		sum  *schemas.CheckpointSummary
		want string
	}{
		{nil, "not checkpointed: the session resumes on an empty workspace"},
		{&schemas.CheckpointSummary{TakenAt: now.Add(-90 * time.Second), Files: 3, Bytes: 200<<20 + 11, BytesMoved: 2048, Seconds: 1.25},
			"3 files, 200.0 MiB, taken 1m30s ago in 1.2s (2.0 KiB sent)"},
		{&schemas.CheckpointSummary{TakenAt: now, Files: 1, Bytes: 12}, "1 file, 12 B, taken 0s ago in 0.0s (0 B sent)"},
	} {
		if got := workspaceText(c.sum, now); got != c.want {
			t.Errorf("workspaceText(%+v) = %q, want %q", c.sum, got, c.want)
		}
	}
}
