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

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/agent/caches"
	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Bounds on one facts report, so a slow runtime or a huge inventory can
// neither stall a report nor outgrow a NATS message.
const (
	runtimeFactsTimeout = 5 * time.Second
	maxFactImages       = 256
)

// meter measures this host for facts.
type meter struct {
	rt           noderuntime.Runtime
	accel        *boundedProbe
	caches       caches.Store
	replicas     *artifactstore.Store
	contentRoot  string
	networkModes []string // Config.NetworkModes
	maxWorkloads int
	watermarks   *schemas.DiskWatermarks
	now          func() time.Time
	log          *zap.Logger
}

// facts measures this host. Anything it cannot measure is left zero or
// stated unestablished (Accelerator.Established, Disk.Known) rather than
// guessed. The slow parts run side by side and all end before it returns.
func (m *meter) facts(ctx context.Context) schemas.NodeFacts {
	h := schemas.HostFacts{
		OS: runtime.GOOS, Architecture: runtime.GOARCH, KernelVersion: kernelRelease(),
		CPUMillis: int64(runtime.NumCPU()) * 1000, MemoryBytes: memTotal(),
		AcceleratorToolkit: acceleratorToolkit(),
		Disk:               disk.Measure(m.contentRoot, m.log),
		NetworkModes:       networkModes(m.networkModes),
	}
	var (
		wg     sync.WaitGroup
		accel  schemas.AcceleratorFacts
		info   noderuntime.RuntimeInfo
		imgs   []schemas.ImageLocality
		caches []schemas.CacheFact
	)
	wg.Go(func() { accel = m.accel.measure(ctx) })
	wg.Go(func() {
		rctx, cancel := context.WithTimeout(ctx, runtimeFactsTimeout)
		defer cancel()
		var err error
		if info, err = m.rt.Info(rctx); err != nil && ctx.Err() == nil {
			m.log.Warn("runtime info for facts", zap.Error(err))
		}
		imgs = m.imageFacts(rctx)
	})
	wg.Go(func() { caches = m.caches.Facts(ctx) })
	wg.Wait()
	h.Accelerator, h.ContainerRuntime, h.RuntimeVersion = accel, info.Name, info.Version
	if p := info.Platform; p.OS == h.OS && p.Architecture == h.Architecture {
		// The runtime knows the CPU variant its pulls and launches pick.
		h.Variant = p.Variant
	}
	support := m.support(info)
	return schemas.NodeFacts{ObservedAt: m.now(), Host: h, Images: imgs, Caches: caches, Support: &support, Artifacts: m.artifactFacts()}
}

// support is what this agent declares it can do: what its runtime says of
// itself, and its own configuration. It always takes prepare-only
// commands; it collects disk when watermarks are set and the content root
// can be measured.
func (m *meter) support(info noderuntime.RuntimeInfo) schemas.NodeSupport {
	s := schemas.NodeSupport{
		ContainerRuntime:       info.Name,
		ExactImageInventory:    info.ExactImageInventory,
		CacheMounts:            info.BindMounts,
		Prewarm:                true,
		MaxConcurrentWorkloads: m.maxWorkloads,
		ArtifactReplicas:       info.BindMounts,
	}
	if w := m.watermarks; w != nil && m.contentRoot != "" {
		s.GarbageCollection = true
		wm := *w
		s.DiskWatermarks = &wm
	}
	return s
}

// artifactFacts lists the node's verified replicas, most recently used
// first when there are more than a report holds.
func (m *meter) artifactFacts() *schemas.ArtifactInventory {
	reps := m.replicas.List()
	if len(reps) > schemas.MaxFactArtifacts {
		slices.SortFunc(reps, func(x, y schemas.ArtifactReplica) int { return y.LastUsedAt.Compare(x.LastUsedAt) })
		reps = reps[:schemas.MaxFactArtifacts]
	}
	return &schemas.ArtifactInventory{Enumerated: true, Replicas: reps}
}

// imageFacts is the runtime's image inventory, trimmed to maxFactImages
// with the readiest images kept: they are what placement is warmest on.
func (m *meter) imageFacts(ctx context.Context) []schemas.ImageLocality {
	imgs, err := m.rt.Images(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("image inventory for facts", zap.Error(err))
		}
		return nil
	}
	if len(imgs) <= maxFactImages {
		return imgs
	}
	m.log.Warn("image inventory trimmed for facts", zap.Int("images", len(imgs)), zap.Int("reported", maxFactImages))
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
