package local_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestExecLauncher runs a stand-in agent (a shell script that records its
// arguments and waits) through provision, stop, start and terminate.
func TestExecLauncher(t *testing.T) {
	dir := t.TempDir()
	agentPath := filepath.Join(dir, "agent.sh")
	script := "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$2\")/args\"\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(agentPath, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	machines := filepath.Join(dir, "machines")
	p := local.New(local.ExecLauncher(local.ExecConfig{AgentPath: agentPath, Dir: machines, Args: []string{"--image-dir", "/imgs"}, StopGrace: 5 * time.Second}),
		capacity.Offer{ID: "local"}, local.WithStopResume())
	ctx := context.Background()
	boot := schemas.NodeBootstrap{ControlPlaneURL: "nats://127.0.0.1:4222", NodeID: "rt-1", RentalID: "rt-1", Generation: 1, EnrollmentToken: "secret"}
	rc, err := p.ProvisionCapacity(ctx, capacity.ProvisionCommand{OperationKey: "rt-1-g1", RentalID: "rt-1", Generation: 1, OwnershipToken: "wf", OfferID: "local", Bootstrap: boot})
	if err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(machines, rc.NativeRef)
	st, err := os.Stat(filepath.Join(mdir, "bootstrap.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("bootstrap file: %v %v", st, err)
	}
	var got schemas.NodeBootstrap
	b, _ := os.ReadFile(filepath.Join(mdir, "bootstrap.json"))
	if json.Unmarshal(b, &got) != nil || got != boot {
		t.Fatalf("bootstrap not delivered verbatim: %s", b)
	}
	args := func() string {
		var s []byte
		for range 100 {
			if s, _ = os.ReadFile(filepath.Join(mdir, "args")); len(s) > 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return string(s)
	}
	if a := args(); !strings.Contains(a, "--containerd-namespace wf-"+rc.NativeRef) || !strings.Contains(a, "--image-dir /imgs") {
		t.Fatalf("agent args: %q", a)
	}
	ref := capacity.Ref{RentalID: "rt-1", NativeRef: rc.NativeRef, OwnershipToken: "wf"}
	if _, err := p.StopCapacity(ctx, capacity.Command{Ref: ref, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if obs, _ := p.ObserveCapacity(ctx, ref); obs.State != capacity.StateStopped {
		t.Fatalf("after stop: %+v", obs)
	}
	if _, err := os.Stat(filepath.Join(mdir, "bootstrap.json")); err != nil {
		t.Fatalf("a stopped machine lost its disk: %v", err)
	}
	if _, err := p.StartCapacity(ctx, capacity.Command{Ref: ref, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if obs, _ := p.ObserveCapacity(ctx, ref); obs.State != capacity.StateRunning {
		t.Fatalf("after start: %+v", obs)
	}
	if n := strings.Count(args(), "--bootstrap"); n != 2 {
		t.Fatalf("agent started %d times", n)
	}
	if _, err := p.TerminateCapacity(ctx, capacity.Command{Ref: ref, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mdir); !os.IsNotExist(err) {
		t.Fatalf("a terminated machine's dir remains: %v", err)
	}
}
