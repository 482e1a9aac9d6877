package agent

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/warmfleet/warmfleet/schemas"
)

// facts measures this host. Anything it cannot measure is left zero rather
// than guessed.
func (a *Agent) facts(ctx context.Context) schemas.NodeFacts {
	h := schemas.HostFacts{
		OS: runtime.GOOS, Architecture: runtime.GOARCH, KernelVersion: kernelRelease(),
		CPUMillis: int64(runtime.NumCPU()) * 1000, MemoryBytes: memTotal(),
	}
	if info, err := a.rt.Info(ctx); err == nil {
		h.ContainerRuntime, h.RuntimeVersion = info.Name, info.Version
	}
	return schemas.NodeFacts{ObservedAt: a.cfg.Now(), Host: h}
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
