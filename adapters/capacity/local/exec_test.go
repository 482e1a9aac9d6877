package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	ctrdrt "github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/internal/ctrdproc"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// standInAgent writes, in a new temp dir, a shell script that stands in for
// warmfleet-agent: it records its arguments beside its data dir and waits
// for SIGTERM.
func standInAgent(t *testing.T) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "agent.sh")
	script := "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$2\")/args\"\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// TestExecLauncher runs a stand-in agent (a shell script that records its
// arguments and waits) through provision, stop, start and terminate.
func TestExecLauncher(t *testing.T) {
	dir, agentPath := standInAgent(t)
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

// TestExecLauncher_ContainerdPerMachine gives two machines their own
// containerd daemons (real ones) and a stand-in agent each: distinct
// sockets and roots, an image imported on A is not on B, A keeps it across
// stop and start, and terminate and shutdown leave neither daemon nor shim
// nor directory behind.
func TestExecLauncher_ContainerdPerMachine(t *testing.T) {
	if err := ctrdproc.Check(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, refusing to skip: %v", err)
		}
		t.Skip(err)
	}
	dir, agentPath := standInAgent(t)
	machines := filepath.Join(dir, "machines")
	p := local.New(local.ExecLauncher(local.ExecConfig{AgentPath: agentPath, Dir: machines, Args: []string{"--image-dir", "/imgs"},
		ContainerdPerMachine: true, StopGrace: 5 * time.Second, Log: zaptest.NewLogger(t)}),
		capacity.Offer{ID: "local"}, local.WithStopResume())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Whatever fails below, no daemon outlives the test.
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })

	type mach struct {
		ref  capacity.Ref
		dir  string
		addr string
	}
	provision := func(rental string) mach {
		t.Helper()
		boot := schemas.NodeBootstrap{ControlPlaneURL: "nats://127.0.0.1:4222", NodeID: rental, RentalID: rental, Generation: 1, EnrollmentToken: "secret"}
		rc, err := p.ProvisionCapacity(ctx, capacity.ProvisionCommand{OperationKey: rental + "-g1", RentalID: rental, Generation: 1, OwnershipToken: "wf",
			OfferID: "local", Bootstrap: boot})
		if err != nil {
			t.Fatal(err)
		}
		m := mach{ref: capacity.Ref{RentalID: rental, NativeRef: rc.NativeRef, OwnershipToken: "wf"}, dir: filepath.Join(machines, rc.NativeRef)}
		m.addr = agentAddress(t, m.dir, 1)
		return m
	}
	a, b := provision("rt-a"), provision("rt-b")
	if a.addr == b.addr {
		t.Fatalf("machines share a containerd socket %s", a.addr)
	}
	for _, m := range []mach{a, b} {
		if !strings.HasPrefix(m.addr, m.dir+"/") {
			t.Fatalf("%s's socket %s is not under its dir", m.ref.NativeRef, m.addr)
		}
		if st, err := os.Stat(filepath.Join(m.dir, "containerd", "root")); err != nil || !st.IsDir() {
			t.Fatalf("%s has no containerd root of its own: %v", m.ref.NativeRef, err)
		}
		if len(daemonPids(m.dir)) != 1 {
			t.Fatalf("%s: want one containerd, have %v", m.ref.NativeRef, daemonPids(m.dir))
		}
	}

	// What the agent would do on A: import an image and run a container.
	imgDir := t.TempDir()
	img := testenv.BuildBusyboxImage(t, imgDir, "busybox")
	rtA := connect(t, ctx, a.addr, "wf-"+a.ref.NativeRef, imgDir)
	if _, err := rtA.EnsureImage(ctx, noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := rtA.Launch(ctx, noderuntime.WorkloadSpec{ID: "sleeper", ImageReference: img.Reference, ManifestDigest: img.ManifestDigest,
		Command: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	_ = rtA.Close()
	if len(ctrdproc.ShimPids(a.addr)) == 0 {
		t.Fatal("A's container runs under no shim of A's daemon")
	}
	if n := imageCount(t, ctx, a.addr); n != 1 {
		t.Fatalf("A holds %d images, want 1", n)
	}
	if n := imageCount(t, ctx, b.addr); n != 0 {
		t.Fatalf("an image imported on A is visible on B (%d images)", n)
	}

	// Stop ends A's agent, daemon and shim, keeping its dirs.
	if _, err := p.StopCapacity(ctx, capacity.Command{Ref: a.ref, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if pids := daemonPids(a.dir); len(pids) != 0 {
		t.Fatalf("stopped machine's containerd still runs: %v", pids)
	}
	if pids := ctrdproc.ShimPids(a.addr); len(pids) != 0 {
		t.Fatalf("stopped machine's shims still run: %v", pids)
	}
	if _, err := os.Stat(filepath.Join(a.dir, "containerd", "root")); err != nil {
		t.Fatalf("a stopped machine lost its containerd root: %v", err)
	}
	if len(daemonPids(b.dir)) != 1 {
		t.Fatal("stopping A stopped B's containerd")
	}

	// Start brings both back from the same dirs: the image is still warm.
	if _, err := p.StartCapacity(ctx, capacity.Command{Ref: a.ref, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if addr := agentAddress(t, a.dir, 2); addr != a.addr {
		t.Fatalf("restarted agent points at %s, not %s", addr, a.addr)
	}
	if obs, _ := p.ObserveCapacity(ctx, a.ref); obs.State != capacity.StateRunning {
		t.Fatalf("after start: %+v", obs)
	}
	if n := imageCount(t, ctx, a.addr); n != 1 {
		t.Fatalf("A lost its image across stop and start (%d images)", n)
	}

	// Terminate removes A's dir and leaves no process of A's.
	if _, err := p.TerminateCapacity(ctx, capacity.Command{Ref: a.ref, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.dir); !os.IsNotExist(err) {
		t.Fatalf("a terminated machine's dir remains: %v", err)
	}
	if pids := daemonPids(a.dir); len(pids) != 0 {
		t.Fatalf("terminated machine's containerd still runs: %v", pids)
	}
	if pids := ctrdproc.ShimPids(a.addr); len(pids) != 0 {
		t.Fatalf("terminated machine's shims still run: %v", pids)
	}

	// A machine whose containerd dies is observed failed: its agent is
	// ended rather than left running against no daemon.
	for _, pid := range daemonPids(b.dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		obs, err := p.ObserveCapacity(ctx, b.ref)
		if err == nil && obs.State == capacity.StateFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B with a dead containerd: %+v %v", obs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Shutdown ends B the same way.
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Fatalf("B's dir remains after shutdown: %v", err)
	}
	if pids := daemonPids(b.dir); len(pids) != 0 {
		t.Fatalf("B's containerd outlived shutdown: %v", pids)
	}
}

// TestExecLauncher_PerMachineRefusesSharedAddress: per-machine containerd
// and a --containerd-address among the extra flags contradict each other.
func TestExecLauncher_PerMachineRefusesSharedAddress(t *testing.T) {
	launch := local.ExecLauncher(local.ExecConfig{AgentPath: "/bin/true", Dir: t.TempDir(), ContainerdPerMachine: true,
		Args: []string{"--containerd-address=/run/containerd/containerd.sock"}})
	if _, err := launch(context.Background(), "m", schemas.NodeBootstrap{}); !errors.Is(err, local.ErrContainerdAddressGiven) {
		t.Fatalf("launch: %v", err)
	}
}

// agentAddress waits for the stand-in agent's nth start and returns the
// --containerd-address it was given.
func agentAddress(t *testing.T, mdir string, nth int) string {
	t.Helper()
	for range 200 {
		raw, _ := os.ReadFile(filepath.Join(mdir, "args"))
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(raw) > 0 && len(lines) >= nth {
			f := strings.Fields(lines[nth-1])
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "--containerd-address" {
					return f[i+1]
				}
			}
			t.Fatalf("agent got no --containerd-address: %q", lines[nth-1])
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("agent in %s did not start %d times", mdir, nth)
	return ""
}

// daemonPids lists containerd daemons whose config lies under mdir.
func daemonPids(mdir string) []int {
	cfg := filepath.Join(mdir, "containerd", "config.toml")
	return ctrdproc.PidsWhere(func(args []string) bool { return slices.Contains(args, cfg) })
}

func connect(t *testing.T, ctx context.Context, addr, ns, imageDir string) *ctrdrt.Runtime {
	t.Helper()
	rt, err := ctrdrt.New(ctx, ctrdrt.Options{Address: addr, Namespace: ns, ImageDir: imageDir, LogDir: t.TempDir(), StateDir: t.TempDir(),
		Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// imageCount counts images in every namespace of the daemon at addr.
func imageCount(t *testing.T, ctx context.Context, addr string) int {
	t.Helper()
	client, err := containerd.New(addr, containerd.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nss, err := client.NamespaceService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ns := range nss {
		imgs, err := client.ImageService().List(namespaces.WithNamespace(ctx, ns))
		if err != nil {
			t.Fatal(err)
		}
		n += len(imgs)
	}
	return n
}
