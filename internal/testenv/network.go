package testenv

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// cniHint tells a developer how to get what NewBridge needs.
const cniHint = "CNI plugins not installed: apt-get install -y containernetworking-plugins iptables"

// CNIPluginDirs are where NewBridge looks for the CNI plugins: Debian's
// package, then the upstream location (the runtime's own defaults).
func CNIPluginDirs() []string { return []string{"/usr/lib/cni", "/opt/cni/bin"} }

// Bridge is a CNI bridge network of one test's own: a bridge name and an
// IPv4 /24 that no other interface on the host uses, so tests running side
// by side never share addresses.
type Bridge struct {
	// Name is the Linux bridge, "wft" and 6 hex digits.
	Name string
	// Subnet is the network's CIDR, 10.x.y.0/24.
	Subnet string
	// Gateway is the bridge's own address, 10.x.y.1: the workloads' default
	// route, and the address a test serves on to stay on this machine.
	Gateway net.IP
}

// NewBridge picks a bridge name and subnet for t and deletes the bridge
// (whoever created it) when t ends. It skips t without root or the CNI
// plugins bridge, host-local and loopback, and fails it under CI.
func NewBridge(t testing.TB) Bridge {
	t.Helper()
	requireRoot(t)
	requireBinaries(t, cniHint, "iptables")
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		found := false
		for _, d := range CNIPluginDirs() {
			if _, err := os.Stat(filepath.Join(d, p)); err == nil {
				found = true
			}
		}
		if !found {
			unavailable(t, "CNI plugin %s not found in %v (%s)", p, CNIPluginDirs(), cniHint)
		}
	}
	used, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("testenv: interface addresses: %v", err)
	}
	var b Bridge
	for tries := 0; ; tries++ {
		if tries == 100 {
			t.Fatal("testenv: no free subnet found in 10.64.0.0/10")
		}
		var r [5]byte
		if _, err := rand.Read(r[:]); err != nil {
			t.Fatal(err)
		}
		// 10.64.0.0 - 10.127.255.0: 16384 /24s.
		n := binary.BigEndian.Uint16(r[:2]) % 16384
		_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", 64+n/256, n%256))
		b = Bridge{Name: "wft" + hex.EncodeToString(r[2:]), Subnet: subnet.String(), Gateway: net.IPv4(10, byte(64+n/256), byte(n%256), 1).To4()}
		if _, err := netlink.LinkByName(b.Name); err == nil {
			continue
		}
		if !slices.ContainsFunc(used, func(a net.Addr) bool {
			ipn, ok := a.(*net.IPNet)
			return ok && (subnet.Contains(ipn.IP) || ipn.Contains(subnet.IP))
		}) {
			break
		}
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(b.Name); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				t.Logf("testenv: delete bridge %s: %v", b.Name, err)
			}
		}
	})
	return b
}

// Create makes the bridge now, with its gateway address and up, so a test
// can listen on Gateway before any workload exists. The bridge plugin
// adopts a bridge that already holds the gateway address.
func (b Bridge) Create(t testing.TB) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.Name}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatalf("testenv: create bridge %s: %v", b.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: b.Gateway, Mask: net.CIDRMask(24, 32)}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		t.Fatalf("testenv: address %s on %s: %v", addr, b.Name, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatalf("testenv: bring up %s: %v", b.Name, err)
	}
}

// Ports are the interfaces attached to the bridge (the host ends of the
// workloads' veths); none when the bridge does not exist.
func (b Bridge) Ports(t testing.TB) []string {
	t.Helper()
	br, err := netlink.LinkByName(b.Name)
	if err != nil {
		return nil
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("testenv: list links: %v", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// IPAMLeases are the addresses host-local IPAM holds under dir, in every
// network it keeps there: its files other than its lock and its
// last-reserved marker.
func IPAMLeases(t testing.TB, dir string) []string {
	t.Helper()
	nets, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("testenv: IPAM dir: %v", err)
	}
	var out []string
	for _, n := range nets {
		if !n.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, n.Name()))
		if err != nil {
			t.Fatalf("testenv: IPAM dir: %v", err)
		}
		for _, f := range files {
			if net.ParseIP(f.Name()) != nil {
				out = append(out, n.Name()+"/"+f.Name())
			}
		}
	}
	return out
}
