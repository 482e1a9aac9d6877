package agent

import (
	"bufio"
	"cmp"
	"context"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Bounds on one facts report, so a slow runtime or a huge inventory can
// neither stall a report nor outgrow a NATS message.
const (
	runtimeFactsTimeout = 5 * time.Second
	maxFactImages       = 256
)

// facts measures this host. Anything it cannot measure is left zero or
// stated unestablished (Accelerator.Established, Disk.Known) rather than
// guessed. The slow parts run side by side and all end before it returns.
func (a *Agent) facts(ctx context.Context) schemas.NodeFacts {
	h := schemas.HostFacts{
		OS: runtime.GOOS, Architecture: runtime.GOARCH, KernelVersion: kernelRelease(),
		CPUMillis: int64(runtime.NumCPU()) * 1000, MemoryBytes: memTotal(),
		AcceleratorToolkit: acceleratorToolkit(),
		Disk:               diskFacts(a.cfg.ContentRoot, a.log),
		NetworkModes:       a.networkModes(),
	}
	var (
		wg     sync.WaitGroup
		accel  schemas.AcceleratorFacts
		info   noderuntime.RuntimeInfo
		imgs   []schemas.ImageLocality
		caches []schemas.CacheFact
	)
	wg.Go(func() { accel = a.accel.measure(ctx) })
	wg.Go(func() {
		rctx, cancel := context.WithTimeout(ctx, runtimeFactsTimeout)
		defer cancel()
		var err error
		if info, err = a.rt.Info(rctx); err != nil && ctx.Err() == nil {
			a.log.Warn("runtime info for facts", zap.Error(err))
		}
		imgs = a.imageFacts(rctx)
	})
	wg.Go(func() { caches = a.caches().facts(ctx) })
	wg.Wait()
	h.Accelerator, h.ContainerRuntime, h.RuntimeVersion = accel, info.Name, info.Version
	if p := info.Platform; p.OS == h.OS && p.Architecture == h.Architecture {
		// The runtime knows the CPU variant its pulls and launches pick.
		h.Variant = p.Variant
	}
	support := a.support(info)
	return schemas.NodeFacts{ObservedAt: a.cfg.Now(), Host: h, Images: imgs, Caches: caches, Support: &support, Artifacts: a.artifactFacts()}
}

// support is what this agent declares it can do: what its runtime says of
// itself, and its own configuration. It always takes prepare-only
// commands; it collects disk when watermarks are set and the content root
// can be measured.
func (a *Agent) support(info noderuntime.RuntimeInfo) schemas.NodeSupport {
	s := schemas.NodeSupport{
		ContainerRuntime:       info.Name,
		ExactImageInventory:    info.ExactImageInventory,
		CacheMounts:            info.BindMounts,
		Prewarm:                true,
		MaxConcurrentWorkloads: a.cfg.MaxWorkloads,
		ArtifactReplicas:       a.artifacts != nil && info.BindMounts,
	}
	if w := a.cfg.DiskWatermarks; w != nil && a.cfg.ContentRoot != "" {
		s.GarbageCollection = true
		wm := *w
		s.DiskWatermarks = &wm
	}
	return s
}

// artifactFacts lists the node's verified replicas, most recently used
// first when there are more than a report holds.
func (a *Agent) artifactFacts() *schemas.ArtifactInventory {
	if a.artifacts == nil {
		return nil
	}
	reps := a.artifacts.List()
	if len(reps) > schemas.MaxFactArtifacts {
		slices.SortFunc(reps, func(x, y schemas.ArtifactReplica) int { return y.LastUsedAt.Compare(x.LastUsedAt) })
		reps = reps[:schemas.MaxFactArtifacts]
	}
	return &schemas.ArtifactInventory{Enumerated: true, Replicas: reps}
}

// imageFacts is the runtime's image inventory, trimmed to maxFactImages
// with the readiest images kept: they are what placement is warmest on.
func (a *Agent) imageFacts(ctx context.Context) []schemas.ImageLocality {
	imgs, err := a.rt.Images(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("image inventory for facts", zap.Error(err))
		}
		return nil
	}
	if len(imgs) <= maxFactImages {
		return imgs
	}
	a.log.Warn("image inventory trimmed for facts", zap.Int("images", len(imgs)), zap.Int("reported", maxFactImages))
	slices.SortStableFunc(imgs, func(x, y schemas.ImageLocality) int {
		return cmp.Compare(localityRank(x.State), localityRank(y.State))
	})
	imgs = imgs[:maxFactImages]
	slices.SortFunc(imgs, func(x, y schemas.ImageLocality) int { return cmp.Compare(x.ManifestDigest, y.ManifestDigest) })
	return imgs
}

func localityRank(s schemas.LocalityState) int {
	switch s {
	case schemas.LocalityHot:
		return 0
	case schemas.LocalityPartial:
		return 1
	case schemas.LocalityCold:
		return 2
	}
	return 3
}

// diskFacts measures the filesystem holding the runtime's content. An unset
// root, or one statfs cannot read, is stated unknown.
func diskFacts(root string, log *zap.Logger) schemas.DiskFacts {
	if root == "" {
		return schemas.DiskFacts{}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		log.Warn("content root not measurable; disk stated unknown", zap.String("content_root", root), zap.Error(err))
		return schemas.DiskFacts{}
	}
	// Block counts are in fragment-size units; bsize is only a hint.
	unit := st.Frsize
	if unit <= 0 {
		unit = st.Bsize
	}
	// Bavail, not Bfree: blocks reserved for root are not ours to promise.
	return schemas.DiskFacts{Known: true, TotalBytes: int64(st.Blocks) * unit, FreeBytes: int64(st.Bavail) * unit}
}

// acceleratorToolkit names the NVIDIA container toolkit when its runtime
// hook is installed: without it no container gets the cards.
func acceleratorToolkit() string {
	for _, bin := range []string{"nvidia-container-runtime-hook", "nvidia-ctk"} {
		if _, err := exec.LookPath(bin); err == nil {
			return "nvidia-container-toolkit"
		}
	}
	return ""
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
