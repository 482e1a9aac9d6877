package containerd

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/zap"
)

// systemdResolvConf lists the upstream servers behind systemd-resolved's
// stub 127.0.0.53, which a bridged workload cannot reach.
const systemdResolvConf = "/run/systemd/resolve/resolv.conf"

// resolvMount copies the host's DNS configuration into dir and mounts the
// copy read-only at /etc/resolv.conf. A host without one gives the
// workload its image's own.
func (n *network) resolvMount(dir string) []oci.SpecOpts {
	src := n.resolvConf
	if src == "" {
		src = hostResolvConf()
	}
	b, err := os.ReadFile(src)
	if err != nil {
		n.log.Warn("no resolv.conf for workload; it keeps its image's", zap.String("source", src), zap.Error(err))
		return nil
	}
	dst := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		n.log.Warn("copy resolv.conf for workload; it keeps its image's", zap.String("path", dst), zap.Error(err))
		return nil
	}
	return []oci.SpecOpts{oci.WithMounts([]specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: dst, Options: []string{"rbind", "ro"}}})}
}

// hostResolvConf is DefaultResolvConf, or systemd-resolved's list of
// upstream servers when the host's file names only its stub.
func hostResolvConf() string {
	b, err := os.ReadFile(DefaultResolvConf)
	if err != nil || !onlyStubResolver(b) {
		return DefaultResolvConf
	}
	if _, err := os.Stat(systemdResolvConf); err == nil {
		return systemdResolvConf
	}
	return DefaultResolvConf
}

// onlyStubResolver reports whether every nameserver in a resolv.conf is
// systemd-resolved's stub.
func onlyStubResolver(b []byte) bool {
	stub := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if f[1] != "127.0.0.53" {
			return false
		}
		stub = true
	}
	return stub
}
