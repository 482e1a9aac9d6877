package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/pkg/netns"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
)

// netRuntime is a Runtime of its own on a bridge of its own, with a
// resolv.conf the test wrote.
type netRuntime struct {
	*Runtime
	bridge   testenv.Bridge
	stateDir string
	opts     Options
}

func (f *fixture) newNetRuntime(t *testing.T) *netRuntime {
	t.Helper()
	b := testenv.NewBridge(t)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\nsearch example.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(f.env.Dir, "state-"+b.Name)
	opts := Options{Address: f.env.Address, Namespace: f.env.Namespace, ImageDir: f.imageDir, LogDir: f.env.Dir + "/logs",
		StateDir: state, Network: NetworkOptions{Bridge: b.Name, Subnet: b.Subnet, ResolvConf: resolv}, Logger: zaptest.NewLogger(t)}
	nr := &netRuntime{bridge: b, stateDir: state, opts: opts}
	nr.Runtime = nr.restart(t)
	return nr
}

// restart connects another Runtime over the same state, as a restarted
// agent does; it is closed when t ends.
func (nr *netRuntime) restart(t *testing.T) *Runtime {
	t.Helper()
	rt, err := New(testCtx(t), nr.opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

// launchOn starts a workload from the fixture image on rt, removed by rt
// when t ends.
func (f *fixture) launchOn(t *testing.T, rt *Runtime, spec noderuntime.WorkloadSpec) {
	t.Helper()
	spec.ImageReference, spec.ManifestDigest = f.image.Reference, f.image.ManifestDigest
	if _, err := rt.Launch(testCtx(t), spec); err != nil {
		t.Fatalf("Launch %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := rt.Remove(context.Background(), spec.ID); err != nil {
			t.Errorf("Remove %s: %v", spec.ID, err)
		}
	})
}

// nothingLeft fails t if the runtime still holds any network state: a
// port on the bridge, an IPAM lease, a workload record or a namespace.
func (nr *netRuntime) nothingLeft(t *testing.T) {
	t.Helper()
	if ports := nr.bridge.Ports(t); len(ports) > 0 {
		t.Errorf("veths left on %s: %v", nr.bridge.Name, ports)
	}
	if leases := testenv.IPAMLeases(t, filepath.Join(nr.stateDir, "ipam")); len(leases) > 0 {
		t.Errorf("IPAM leases left: %v", leases)
	}
	for _, d := range []string{"workloads", "netns"} {
		if left, _ := os.ReadDir(filepath.Join(nr.stateDir, d)); len(left) > 0 {
			t.Errorf("%s left in %s: %d entries", d, nr.stateDir, len(left))
		}
	}
}

func (f *fixture) testNetwork(t *testing.T) {
	t.Run("BridgeAttachAndRelease", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		if !slices.Contains(nr.NetworkModes(), noderuntime.NetworkBridge) {
			t.Fatalf("NetworkModes = %v, want bridge", nr.NetworkModes())
		}
		gw := nr.bridge.Gateway.String()
		// The gateway answers over TCP (ping needs CAP_NET_RAW, which
		// workloads do not hold); the bridge has no address before the
		// launch, so the server listens on every address. (busybox 1.35's
		// wget -T segfaults, so no -T.)
		ln, err := net.Listen("tcp4", ":0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "gateway reachable\n") }),
			ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		f.launchOn(t, nr.Runtime, noderuntime.WorkloadSpec{ID: "net-bridge", Network: noderuntime.NetworkBridge, Command: []string{"sh", "-c",
			"busybox ip -4 addr show eth0 && busybox ip route && cat /etc/resolv.conf && busybox ip link show lo && busybox wget -O - http://" + gw + ":" + port + "/"}})
		st := wait(t, nr.Runtime, "net-bridge")
		log, _ := finishedOutput(t, nr.Runtime, "net-bridge")
		if st.ExitCode != 0 {
			t.Fatalf("workload exited %d:\n%s", st.ExitCode, log)
		}
		prefix := strings.TrimSuffix(gw, "1")
		for _, want := range []string{"inet " + prefix, "default via " + gw, "nameserver 192.0.2.53", "search example.test", "UP", "gateway reachable"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("workload output lacks %q:\n%s", want, log)
			}
		}
		// Exited but not removed: its address and veth are still its own.
		if ports := nr.bridge.Ports(t); len(ports) != 1 {
			t.Errorf("ports on the bridge before Remove: %v, want one veth", ports)
		}
		if leases := testenv.IPAMLeases(t, filepath.Join(nr.stateDir, "ipam")); len(leases) != 1 {
			t.Errorf("IPAM leases before Remove: %v, want one", leases)
		}
		if err := nr.Remove(testCtx(t), "net-bridge"); err != nil {
			t.Fatal(err)
		}
		nr.nothingLeft(t)
		if err := nr.Remove(testCtx(t), "net-bridge"); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
	})

	t.Run("BridgeSetupFailureLeavesNothing", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		spec := noderuntime.WorkloadSpec{ID: "net-fail", Network: noderuntime.NetworkBridge, Command: []string{"true"},
			ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest}
		// One launch first, so the bridge exists with its address: the
		// bridge plugin cannot finish a bridge whose first setup failed.
		if _, err := nr.Launch(testCtx(t), spec); err != nil {
			t.Fatal(err)
		}
		wait(t, nr.Runtime, "net-fail")
		if err := nr.Remove(testCtx(t), "net-fail"); err != nil {
			t.Fatal(err)
		}
		// Every address of the subnet leased: the CNI setup, which runs
		// while the container and task are created, fails in IPAM.
		leases := filepath.Join(nr.stateDir, "ipam", "warmfleet-"+nr.bridge.Name)
		if err := os.MkdirAll(leases, 0o700); err != nil {
			t.Fatal(err)
		}
		prefix := strings.TrimSuffix(nr.bridge.Gateway.String(), "1")
		for i := 2; i < 255; i++ {
			if err := os.WriteFile(filepath.Join(leases, prefix+strconv.Itoa(i)), []byte("taken\neth0"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := nr.Launch(testCtx(t), spec); err == nil || !strings.Contains(err.Error(), "attach net-fail to the bridge") {
			t.Fatalf("Launch with no address free: %v, want the bridge attach's failure", err)
		}
		if _, err := nr.Inspect(testCtx(t), "net-fail"); !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			t.Errorf("container left after the failed Launch (Inspect: %v)", err)
		}
		ctx := namespaces.WithNamespace(testCtx(t), f.env.Namespace)
		if _, err := nr.client.SnapshotService(nr.Snapshotter()).Stat(ctx, "net-fail"); !errdefs.IsNotFound(err) {
			t.Errorf("snapshot left after the failed Launch (Stat: %v)", err)
		}
		if err := os.RemoveAll(leases); err != nil {
			t.Fatal(err)
		}
		nr.nothingLeft(t)
		// With addresses free again the same id launches: nothing of the
		// failed one stands in its way.
		f.launchOn(t, nr.Runtime, spec)
		if st := wait(t, nr.Runtime, "net-fail"); st.ExitCode != 0 {
			t.Fatalf("relaunch exited %d", st.ExitCode)
		}
	})

	t.Run("LeftoversReleasedAfterRestart", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		live := nr.Runtime // the runtime that removes net-keep when t ends
		t.Cleanup(func() { _ = live.Remove(context.Background(), "net-keep") })
		for _, id := range []string{"net-keep", "net-gone"} {
			if _, err := nr.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: id, Network: noderuntime.NetworkBridge, Command: []string{"sleep", "300"},
				ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest}); err != nil {
				t.Fatal(err)
			}
		}
		// net-gone goes behind the runtime's back (a reboot, an operator),
		// a crash leaves a namespace whose record was never written, and
		// the agent dies.
		ctx := nr.ctx(testCtx(t))
		c, err := nr.client.LoadContainer(ctx, "net-gone")
		if err != nil {
			t.Fatal(err)
		}
		if task, err := c.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, ctrd.WithProcessKill); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil {
			t.Fatal(err)
		}
		stray, err := netns.NewNetNS(filepath.Join(nr.stateDir, "netns"))
		if err != nil {
			t.Fatal(err)
		}
		if err := nr.Close(); err != nil {
			t.Fatal(err)
		}
		if ports := nr.bridge.Ports(t); len(ports) != 2 {
			t.Fatalf("ports before restart: %v, want two veths", ports)
		}

		second := nr.restart(t)
		live = second
		if ports := nr.bridge.Ports(t); len(ports) != 1 {
			t.Errorf("ports after restart: %v, want only net-keep's veth", ports)
		}
		if leases := testenv.IPAMLeases(t, filepath.Join(nr.stateDir, "ipam")); len(leases) != 1 {
			t.Errorf("IPAM leases after restart: %v, want only net-keep's", leases)
		}
		if _, err := os.Stat(stray.GetPath()); !os.IsNotExist(err) {
			t.Errorf("stray namespace %s survived the restart (stat: %v)", stray.GetPath(), err)
		}
		if _, err := os.Stat(filepath.Join(nr.stateDir, "workloads", "net-gone")); !os.IsNotExist(err) {
			t.Errorf("net-gone's record survived the restart (stat: %v)", err)
		}
		if err := second.Remove(testCtx(t), "net-keep"); err != nil {
			t.Fatal(err)
		}
		nr.nothingLeft(t)
	})

	t.Run("HostSharesTheHostNetwork", func(t *testing.T) {
		t.Parallel()
		nr := f.newNetRuntime(t)
		nr.bridge.Create(t) // an interface only the host has
		f.launchOn(t, nr.Runtime, noderuntime.WorkloadSpec{ID: "net-host", Network: noderuntime.NetworkHost,
			Command: []string{"sh", "-c", "cat /proc/net/dev /etc/resolv.conf"}})
		st := wait(t, nr.Runtime, "net-host")
		log, _ := finishedOutput(t, nr.Runtime, "net-host")
		if st.ExitCode != 0 || !strings.Contains(string(log), nr.bridge.Name+":") || !strings.Contains(string(log), "nameserver 192.0.2.53") {
			t.Fatalf("exit %d; want the host's %s and the resolv.conf in:\n%s", st.ExitCode, nr.bridge.Name, log)
		}
		if err := nr.Remove(testCtx(t), "net-host"); err != nil {
			t.Fatal(err)
		}
		nr.nothingLeft(t)
	})

	t.Run("NoneHasLoopbackOnly", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []noderuntime.NetworkMode{noderuntime.NetworkNone, ""} {
			id := "net-none" + string(mode)
			f.launch(t, f.rt, noderuntime.WorkloadSpec{ID: id, Network: mode, Command: []string{"cat", "/proc/net/dev"}})
			st := wait(t, f.rt, id)
			log, _ := finishedOutput(t, f.rt, id)
			var ifaces []string
			for _, line := range strings.Split(string(log), "\n") {
				if name, _, ok := strings.Cut(line, ":"); ok {
					ifaces = append(ifaces, strings.TrimSpace(name))
				}
			}
			if st.ExitCode != 0 || !slices.Equal(ifaces, []string{"lo"}) {
				t.Fatalf("network %q: exit %d, interfaces %v, want only lo:\n%s", mode, st.ExitCode, ifaces, log)
			}
		}
	})

	t.Run("BridgeUnavailableWithoutPlugins", func(t *testing.T) {
		t.Parallel()
		rt, err := New(testCtx(t), Options{Address: f.env.Address, Namespace: f.env.Namespace, LogDir: t.TempDir(), StateDir: t.TempDir(),
			Network: NetworkOptions{PluginDirs: []string{t.TempDir()}}, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		if modes := rt.NetworkModes(); slices.Contains(modes, noderuntime.NetworkBridge) {
			t.Fatalf("NetworkModes = %v without CNI plugins", modes)
		}
		_, err = rt.Launch(testCtx(t), noderuntime.WorkloadSpec{ID: "net-unavailable", Network: noderuntime.NetworkBridge,
			ImageReference: f.image.Reference, ManifestDigest: f.image.ManifestDigest, Command: []string{"true"}})
		requireIs(t, err, ErrNetworkUnavailable)
		_, err = rt.Inspect(testCtx(t), "net-unavailable")
		requireIs(t, err, noderuntime.ErrWorkloadNotFound)
	})
}

// TestNetworkSpecOptions checks the spec each mode builds, without a
// daemon: host drops the network namespace and mounts the host's hosts
// file and the resolv.conf copy; none keeps containerd's fresh namespace;
// bridge without plugins is refused; an unknown mode is refused.
func TestNetworkSpecOptions(t *testing.T) {
	state := t.TempDir()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := NetworkOptions{PluginDirs: []string{t.TempDir()}, ResolvConf: resolv}.resolve(state)
	if err != nil {
		t.Fatal(err)
	}
	n, err := newNetwork(opts, state, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	spec := func(mode noderuntime.NetworkMode) *oci.Spec {
		t.Helper()
		att, err := n.attach(context.Background(), "w-"+string(mode), mode)
		if err != nil {
			t.Fatalf("attach %q: %v", mode, err)
		}
		if err := att.wait(); err != nil {
			t.Fatalf("attach %q: %v", mode, err)
		}
		ctx := namespaces.WithNamespace(context.Background(), "test")
		s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "w"}, att.opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hasNetNS := func(s *oci.Spec) bool {
		return slices.ContainsFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.NetworkNamespace })
	}
	mountOf := func(s *oci.Spec, dst string) *specs.Mount {
		for i := range s.Mounts {
			if s.Mounts[i].Destination == dst {
				return &s.Mounts[i]
			}
		}
		return nil
	}

	host := spec(noderuntime.NetworkHost)
	if hasNetNS(host) {
		t.Error("host mode keeps a network namespace")
	}
	m := mountOf(host, "/etc/resolv.conf")
	if m == nil || !slices.Contains(m.Options, "ro") {
		t.Fatalf("host mode resolv.conf mount %+v", m)
	}
	if b, err := os.ReadFile(m.Source); err != nil || string(b) != "nameserver 192.0.2.1\n" {
		t.Errorf("resolv.conf copy %q (%v)", b, err)
	}
	if mountOf(host, "/etc/hosts") == nil {
		t.Error("host mode does not mount the host's /etc/hosts")
	}
	if err := n.detach(context.Background(), "w-host"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(m.Source)); !os.IsNotExist(err) {
		t.Errorf("detach left %s (stat: %v)", filepath.Dir(m.Source), err)
	}

	none := spec(noderuntime.NetworkNone)
	if !hasNetNS(none) || mountOf(none, "/etc/resolv.conf") != nil {
		t.Errorf("none mode: namespaces %+v, resolv.conf %+v", none.Linux.Namespaces, mountOf(none, "/etc/resolv.conf"))
	}
	for _, ns := range none.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path != "" {
			t.Errorf("none mode joins %s, want a fresh namespace", ns.Path)
		}
	}

	if _, err := n.attach(context.Background(), "w-bridge", noderuntime.NetworkBridge); !errors.Is(err, ErrNetworkUnavailable) {
		t.Errorf("bridge without plugins: %v, want ErrNetworkUnavailable", err)
	}
	if _, err := n.attach(context.Background(), "w-odd", "overlay"); !errors.Is(err, ErrNetworkUnavailable) {
		t.Errorf("unknown mode: %v, want ErrNetworkUnavailable", err)
	}
	if left, _ := os.ReadDir(filepath.Join(state, "workloads")); len(left) != 0 {
		t.Errorf("refused attaches left %d workload dirs", len(left))
	}
}

func TestBridgeConfList(t *testing.T) {
	b, err := bridgeConfList("warmfleet-wfx", "wfx", "10.1.2.0/24", "/state/ipam")
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type      string `json:"type"`
			Bridge    string `json:"bridge"`
			IsGateway bool   `json:"isGateway"`
			IPMasq    bool   `json:"ipMasq"`
			IPAM      struct {
				Type    string                `json:"type"`
				Ranges  [][]map[string]string `json:"ranges"`
				DataDir string                `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	p := conf.Plugins[0]
	if conf.Name != "warmfleet-wfx" || p.Type != "bridge" || p.Bridge != "wfx" || !p.IsGateway || !p.IPMasq ||
		p.IPAM.Type != "host-local" || p.IPAM.Ranges[0][0]["subnet"] != "10.1.2.0/24" || p.IPAM.DataDir != "/state/ipam" {
		t.Fatalf("conflist %s", b)
	}
}

func TestNetworkOptionsRefused(t *testing.T) {
	for name, o := range map[string]NetworkOptions{
		"bad subnet":       {Subnet: "10.1.2.0"},
		"ipv6 subnet":      {Subnet: "fd00::/64"},
		"long bridge name": {Bridge: "a-bridge-name-too-long"},
	} {
		if _, err := o.resolve(t.TempDir()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestOnlyStubResolver(t *testing.T) {
	for in, want := range map[string]bool{
		"nameserver 127.0.0.53\noptions edns0\n":         true,
		"# generated\nnameserver 127.0.0.53\nsearch x\n": true,
		"nameserver 10.0.0.2\n":                          false,
		"nameserver 127.0.0.53\nnameserver 10.0.0.2\n":   false,
		"": false,
	} {
		if got := onlyStubResolver([]byte(in)); got != want {
			t.Errorf("onlyStubResolver(%q) = %v, want %v", in, got, want)
		}
	}
}
