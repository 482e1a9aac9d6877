package containerd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/nodelog"
)

// Defaults for Options.
const (
	DefaultAddress   = "/run/containerd/containerd.sock"
	DefaultNamespace = "warmfleet"
	// runcRuntime is containerd's runc shim v2, the only runtime we use.
	runcRuntime = "io.containerd.runc.v2"
)

// Defaults for NetworkOptions.
const (
	DefaultBridge = "wf0"
	// DefaultSubnet is a /16 that Docker, Podman, Kubernetes CNIs and the
	// usual cloud VPC defaults leave alone.
	DefaultSubnet = "10.231.0.0/16"
	// DefaultResolvConf is the host file a workload's /etc/resolv.conf is
	// copied from, unless it only names systemd-resolved's stub.
	DefaultResolvConf = "/etc/resolv.conf"
)

// DefaultCNIPluginDirs are searched for CNI plugins: Debian's
// containernetworking-plugins package, then the upstream location.
func DefaultCNIPluginDirs() []string { return []string{"/usr/lib/cni", "/opt/cni/bin"} }

// Options configures a Runtime.
type Options struct {
	// Address is containerd's gRPC socket; DefaultAddress when empty.
	Address string
	// Namespace isolates this agent's images and containers in containerd;
	// DefaultNamespace when empty.
	Namespace string
	// ImageDir holds OCI image archives (<hex>.tar) EnsureImage imports
	// before it tries a registry. Empty disables archive lookup.
	ImageDir string
	// Snapshotter is the containerd snapshotter for rootfs. Empty means
	// "overlayfs", falling back to "native" when overlayfs did not load.
	Snapshotter string
	// LogDir holds the output directories of workloads whose spec names
	// none, as <LogDir>/<id>. Empty means a directory under os.TempDir
	// named for the namespace.
	LogDir string
	// LogWriter is the binary containerd's shim runs beside each workload
	// to keep its output (package nodelog's writer: any binary that calls
	// nodelog.WriterMain first, warmfleet-agent among them). Empty means
	// this process's own executable. New checks that it answers.
	LogWriter string
	// StateDir holds what the runtime keeps per workload beside containerd:
	// network records, resolv.conf copies, network namespaces and (by
	// default) the IPAM leases. Empty means a directory under os.TempDir
	// named for the namespace. Give each runtime its own.
	StateDir string
	// Network configures the bridge network and workloads' DNS.
	Network NetworkOptions
	// Logger gets the adapter's logs; zap.NewNop when nil.
	Logger *zap.Logger
	// CDISpecDirs are the directories of the CDI specs a workload's
	// Devices are resolved against, lowest priority first;
	// cdispec.DefaultDirs (/etc/cdi, /var/run/cdi) when empty. They are
	// reread at every Launch that names devices.
	CDISpecDirs []string
	// InsecureRegistries are registry hosts (host[:port]) pulled from over
	// plain HTTP, besides loopback hosts, which always are.
	InsecureRegistries []string
}

// NetworkOptions configures the bridge network workloads get with
// noderuntime.NetworkBridge, and the DNS every networked workload gets.
type NetworkOptions struct {
	// PluginDirs are searched for the CNI plugins bridge, host-local and
	// loopback; DefaultCNIPluginDirs when empty.
	PluginDirs []string
	// Bridge is the Linux bridge the workloads' veths join; DefaultBridge
	// when empty. The bridge plugin creates it.
	Bridge string
	// Subnet is the bridge network's IPv4 CIDR; DefaultSubnet when empty.
	// Its first address is the bridge's own (the workloads' gateway), and
	// traffic leaving it is masqueraded.
	Subnet string
	// IPAMDir is the host-local IPAM plugin's data dir; <StateDir>/ipam
	// when empty. Runtimes that share a bridge must share it, or they hand
	// out the same addresses.
	IPAMDir string
	// ResolvConf is copied into bridge and host workloads as
	// /etc/resolv.conf. Empty means DefaultResolvConf, or
	// /run/systemd/resolve/resolv.conf when the host's file names only the
	// systemd-resolved stub 127.0.0.53.
	ResolvConf string
}

// resolve fills in the defaults and checks every option New is given, so
// the parts New builds from them can trust what they get: the log writer
// answers, the log directory exists, and both directories are absolute
// (the shim opens the log files from another working directory).
func (o Options) resolve(ctx context.Context) (Options, error) {
	if o.Address == "" {
		o.Address = DefaultAddress
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(os.TempDir(), "warmfleet-"+o.Namespace+"-logs")
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(os.TempDir(), "warmfleet-"+o.Namespace+"-state")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.LogWriter == "" {
		self, err := os.Executable()
		if err != nil {
			return o, fmt.Errorf("find this executable for the log writer: %w", err)
		}
		o.LogWriter = self
	}
	if err := nodelog.Probe(ctx, o.LogWriter); err != nil {
		return o, err
	}
	var err error
	if o.LogDir, err = filepath.Abs(o.LogDir); err != nil {
		return o, fmt.Errorf("log dir: %w", err)
	}
	if err := os.MkdirAll(o.LogDir, 0o700); err != nil {
		return o, fmt.Errorf("create log dir: %w", err)
	}
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		return o, fmt.Errorf("state dir: %w", err)
	}
	o.Network, err = o.Network.resolve(o.StateDir)
	return o, err
}

// resolve fills in the network's defaults (the IPAM leases under
// stateDir) and checks the bridge's name and subnet.
func (o NetworkOptions) resolve(stateDir string) (NetworkOptions, error) {
	if len(o.PluginDirs) == 0 {
		o.PluginDirs = DefaultCNIPluginDirs()
	}
	if o.Bridge == "" {
		o.Bridge = DefaultBridge
	}
	if o.Subnet == "" {
		o.Subnet = DefaultSubnet
	}
	if o.IPAMDir == "" {
		o.IPAMDir = filepath.Join(stateDir, "ipam")
	}
	if ip, _, err := net.ParseCIDR(o.Subnet); err != nil {
		return o, fmt.Errorf("network: subnet %q: %w", o.Subnet, err)
	} else if ip.To4() == nil {
		return o, fmt.Errorf("network: subnet %q is not IPv4", o.Subnet)
	}
	if len(o.Bridge) > 15 {
		return o, fmt.Errorf("network: bridge name %q is longer than 15 bytes", o.Bridge)
	}
	return o, nil
}
