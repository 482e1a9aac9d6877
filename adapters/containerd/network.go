package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/pkg/netns"
	gocni "github.com/containerd/go-cni"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// networkTimeout bounds a network teardown that runs after the caller's
// context ended.
const networkTimeout = 30 * time.Second

// cniPlugins are the CNI plugins the bridge network runs.
func cniPlugins() []string { return []string{"bridge", "host-local", "loopback"} }

// ErrNetworkUnavailable reports a workload asking for a network this
// runtime cannot give (the CNI plugins are missing, or the mode is unknown).
var ErrNetworkUnavailable = errors.New("network unavailable")

// netRecord is what the runtime keeps on disk about one workload's
// network, written before anything is attached, so a restarted runtime can
// release what a crash left behind.
type netRecord struct {
	ID   string                  `json:"id"`
	Mode noderuntime.NetworkMode `json:"mode"`
	// NetNS is the network namespace's bind mount (bridge mode).
	NetNS string `json:"netns,omitempty"`
}

// network gives workloads their networks. Its state is files under its
// directories: one dir per workload (record and resolv.conf) and the
// network namespaces' mount points.
type network struct {
	cni          gocni.CNI // nil when unavailable says why
	unavailable  error
	name         string // the CNI network's name
	workloadsDir string
	netnsDir     string
	ipamDir      string
	resolvConf   string // the option; "" chooses at each launch
	log          *zap.Logger
}

// newNetwork prepares the bridge network under stateDir, from options
// NetworkOptions.resolve has checked. Missing CNI plugins do not fail it:
// bridge workloads are then refused and Modes leaves bridge out.
func newNetwork(opts NetworkOptions, stateDir string, log *zap.Logger) (*network, error) {
	n := &network{
		name:         "warmfleet-" + opts.Bridge,
		workloadsDir: filepath.Join(stateDir, "workloads"),
		netnsDir:     filepath.Join(stateDir, "netns"),
		ipamDir:      opts.IPAMDir,
		resolvConf:   opts.ResolvConf,
		log:          log,
	}
	for _, d := range []string{n.workloadsDir, n.netnsDir, n.ipamDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
	}
	if missing := missingPlugins(opts.PluginDirs); len(missing) > 0 {
		n.unavailable = fmt.Errorf("%w: bridge: CNI plugins %s not found in %s (apt-get install containernetworking-plugins)",
			ErrNetworkUnavailable, strings.Join(missing, ", "), strings.Join(opts.PluginDirs, ":"))
		log.Warn("bridge network unavailable", zap.Error(n.unavailable))
		return n, nil
	}
	conf, err := bridgeConfList(n.name, opts.Bridge, opts.Subnet, n.ipamDir)
	if err != nil {
		return nil, err
	}
	// The bridge network is eth0; loopback, loaded after it, brings lo up.
	cni, err := gocni.New(gocni.WithPluginDir(opts.PluginDirs), gocni.WithMinNetworkCount(2))
	if err != nil {
		return nil, fmt.Errorf("network: cni: %w", err)
	}
	if err := cni.Load(gocni.WithConfListBytes(conf), gocni.WithLoNetwork); err != nil {
		return nil, fmt.Errorf("network: load cni config: %w", err)
	}
	n.cni = cni
	log.Info("bridge network", zap.String("bridge", opts.Bridge), zap.String("subnet", opts.Subnet), zap.String("ipam_dir", n.ipamDir))
	return n, nil
}

// bridgeConfList is the CNI configuration: a bridge that is the
// workloads' gateway and masquerades what leaves the subnet, with
// addresses from host-local IPAM kept in ipamDir.
func bridgeConfList(name, bridge, subnet, ipamDir string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       name,
		"plugins": []any{map[string]any{
			"type":      "bridge",
			"bridge":    bridge,
			"isGateway": true,
			"ipMasq":    true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": subnet}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": ipamDir,
			},
		}},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("network: cni config: %w", err)
	}
	return b, nil
}

func missingPlugins(dirs []string) []string {
	var missing []string
	for _, p := range cniPlugins() {
		found := false
		for _, d := range dirs {
			if st, err := os.Stat(filepath.Join(d, p)); err == nil && st.Mode().IsRegular() {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, p)
		}
	}
	return missing
}

// Modes are the network modes this network gives workloads.
func (n *network) Modes() []noderuntime.NetworkMode {
	var out []noderuntime.NetworkMode
	for _, m := range noderuntime.AllNetworkModes() {
		if m != noderuntime.NetworkBridge || n.unavailable == nil {
			out = append(out, m)
		}
	}
	return out
}

// attachment is a workload's network as attach hands it over: the spec
// options that put the container in it are known at once; the interfaces
// may still be being set up until wait returns.
type attachment struct {
	opts []oci.SpecOpts
	done <-chan struct{} // nil: nothing in flight
	err  error           // set before done closes
}

// wait blocks until the network is set up and reports whether it was.
// Launch calls it before the task starts, and before releasing the
// network on failure, so no setup outlives the Launch that began it.
func (a *attachment) wait() error {
	if a.done != nil {
		<-a.done
	}
	return a.err
}

// attach gives workload id its network. For a bridge the CNI setup runs
// in the background, into a namespace that exists on return: the container
// and its task can be created in the meantime, since only the process's
// start needs the interfaces. On failure nothing is left behind; a setup
// that fails later is reported by wait, and the caller releases.
func (n *network) attach(ctx context.Context, id string, mode noderuntime.NetworkMode) (*attachment, error) {
	switch mode {
	case "", noderuntime.NetworkNone:
		// containerd's default spec: a fresh namespace, runc brings lo up.
		return &attachment{}, nil
	case noderuntime.NetworkHost:
		dir, err := n.begin(netRecord{ID: id, Mode: mode})
		if err != nil {
			return nil, err
		}
		opts := []oci.SpecOpts{oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile}
		return &attachment{opts: append(opts, n.resolvMount(dir)...)}, nil
	case noderuntime.NetworkBridge:
		return n.attachBridge(ctx, id)
	}
	return nil, fmt.Errorf("%w: unknown network mode %q", ErrNetworkUnavailable, mode)
}

func (n *network) attachBridge(ctx context.Context, id string) (*attachment, error) {
	if n.unavailable != nil {
		return nil, n.unavailable
	}
	ns, err := netns.NewNetNS(n.netnsDir)
	if err != nil {
		return nil, fmt.Errorf("network: create network namespace: %w", err)
	}
	// The record names the namespace before CNI touches it: whatever a
	// crash leaves from here on, a restarted runtime finds and releases.
	dir, err := n.begin(netRecord{ID: id, Mode: noderuntime.NetworkBridge, NetNS: ns.GetPath()})
	if err != nil {
		if rerr := ns.Remove(); rerr != nil {
			n.log.Warn("remove network namespace", zap.String("workload", id), zap.Error(rerr))
		}
		return nil, err
	}
	opts := []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: ns.GetPath()})}
	done := make(chan struct{})
	a := &attachment{opts: append(opts, n.resolvMount(dir)...), done: done}
	go func() {
		defer close(done)
		res, err := n.cni.Setup(ctx, id, ns.GetPath())
		if err != nil {
			a.err = fmt.Errorf("network: attach %s to the bridge: %w", id, err)
			return
		}
		fields := []zap.Field{zap.String("workload", id), zap.String("netns", ns.GetPath())}
		if eth, ok := res.Interfaces["eth0"]; ok && len(eth.IPConfigs) > 0 {
			fields = append(fields, zap.Stringer("ip", eth.IPConfigs[0].IP))
		}
		n.log.Debug("bridge network attached", fields...)
	}()
	return a, nil
}

// begin creates the workload's directory and writes its record.
func (n *network) begin(rec netRecord) (string, error) {
	if err := identifiers.Validate(rec.ID); err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	dir := filepath.Join(n.workloadsDir, rec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("network: record: %w", err)
	}
	tmp := filepath.Join(dir, "network.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return "", fmt.Errorf("network: record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "network.json")); err != nil {
		return "", fmt.Errorf("network: record: %w", err)
	}
	return dir, nil
}

// detach releases what attach gave workload id: its address and veth (a
// CNI DEL while its namespace still exists, so the bridge plugin also
// removes its masquerade rules), its namespace and its directory. A
// workload without a record has nothing to release. It runs even when ctx
// has ended; on error the record stays for the next try.
func (n *network) detach(ctx context.Context, id string) error {
	if err := identifiers.Validate(id); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), networkTimeout)
	defer cancel()
	dir := filepath.Join(n.workloadsDir, id)
	b, err := os.ReadFile(filepath.Join(dir, "network.json"))
	if errors.Is(err, os.ErrNotExist) {
		return removeDir(dir)
	}
	if err != nil {
		return fmt.Errorf("network: read record of %s: %w", id, err)
	}
	var rec netRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		n.log.Warn("unreadable network record dropped", zap.String("workload", id), zap.Error(err))
		return removeDir(dir)
	}
	if rec.NetNS != "" {
		if err := n.release(ctx, id, rec.NetNS); err != nil {
			return err
		}
	}
	return removeDir(dir)
}

// release runs CNI DEL for id and removes its namespace.
func (n *network) release(ctx context.Context, id, nsPath string) error {
	ns := netns.LoadNetNS(nsPath)
	cniPath := nsPath
	// A namespace gone (a reboot, a removal interrupted) leaves only the
	// address to release: CNI DEL without a namespace does exactly that.
	if closed, err := ns.Closed(); err != nil {
		return fmt.Errorf("network: namespace of %s: %w", id, err)
	} else if closed {
		cniPath = ""
	}
	if n.cni == nil {
		return fmt.Errorf("network: release %s: %w", id, n.unavailable)
	}
	if err := n.cni.Remove(ctx, id, cniPath); err != nil {
		return fmt.Errorf("network: detach %s from the bridge: %w", id, err)
	}
	if err := ns.Remove(); err != nil {
		return fmt.Errorf("network: remove namespace of %s: %w", id, err)
	}
	n.log.Debug("bridge network released", zap.String("workload", id))
	return nil
}

func removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// reconcile releases the network of every workload that no longer exists
// (exists answers for containerd), then removes namespaces no record names
// (a crash between creating one and writing its record). A restarted
// runtime calls it before its first launch.
func (n *network) reconcile(ctx context.Context, exists func(ctx context.Context, id string) (bool, error)) error {
	entries, err := os.ReadDir(n.workloadsDir)
	if err != nil {
		return fmt.Errorf("network: reconcile: %w", err)
	}
	var errs []error
	kept := map[string]bool{}
	for _, e := range entries {
		id := e.Name()
		ok, err := exists(ctx, id)
		if err != nil {
			errs = append(errs, err)
			kept[n.recordedNetNS(id)] = true
			continue
		}
		if ok {
			kept[n.recordedNetNS(id)] = true
			continue
		}
		if err := n.detach(ctx, id); err != nil {
			errs = append(errs, err)
			kept[n.recordedNetNS(id)] = true
			continue
		}
		n.log.Info("released the network of a workload that is gone", zap.String("workload", id))
	}
	nss, err := os.ReadDir(n.netnsDir)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("network: reconcile: %w", err))...)
	}
	for _, e := range nss {
		p := filepath.Join(n.netnsDir, e.Name())
		if kept[p] {
			continue
		}
		if err := netns.LoadNetNS(p).Remove(); err != nil {
			errs = append(errs, fmt.Errorf("network: remove stray namespace %s: %w", p, err))
			continue
		}
		n.log.Info("removed a network namespace no workload owns", zap.String("netns", p))
	}
	return errors.Join(errs...)
}

// recordedNetNS is the namespace workload id's record names, if any.
func (n *network) recordedNetNS(id string) string {
	b, err := os.ReadFile(filepath.Join(n.workloadsDir, id, "network.json"))
	if err != nil {
		return ""
	}
	var rec netRecord
	if json.Unmarshal(b, &rec) != nil {
		return ""
	}
	return rec.NetNS
}
