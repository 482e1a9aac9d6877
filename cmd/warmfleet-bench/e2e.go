package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/ociimage"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

type e2eOpts struct {
	runs    int
	command []string
	gap     time.Duration
	// The production-sized cases (0 runs: skipped).
	sized sizedOpts
}

func newE2ECmd(g *globals) *cobra.Command {
	o := e2eOpts{}
	cmd := &cobra.Command{
		Use:   "e2e",
		Short: "Submit → container running on real containerd, warm vs cold, vs calling containerd directly",
		Long: `e2e starts a private containerd (as scripts/run-local.sh does), an embedded
NATS, the control plane and one real agent on the containerd runtime, and
submits Runs one at a time, each after the last ended:

  warm  the image is already in containerd (imported by an untimed first Run)
  cold  every Run names a different image (busybox plus one distinct file),
        so each imports its OCI archive and unpacks its layer

Each Run's phases come from its events (accepted, placed, preparing,
launching, running; the control plane's clock), and submit → running is
timed on this process's clock from the publish to the running event.

Production-sized cases (--sized-runs each per link speed; 0 skips them): an
image of --image-mib incompressible MiB in --image-layers gzip layers on
busybox, of which --base-layers are a base shared with a second variant,
pushed to a private docker-registry (htpasswd; the control plane holds the
account, the agent asks for it at pull time), and an --artifact-mib
artifact in the artifact object store that every timed Run mounts. The
node reaches both through one shaped link: TCP proxies on loopback in front
of the registry and of the agent's NATS connection, whose bytes towards the
node share one token bucket at each --link speed (Mbit/s), checked by a raw
transfer through it.

  warm     the image and the artifact are present
  partial  the variant's base layers and the artifact are present: a new
           build of the same service on the same base and weights
  cold     nothing is present: before each Run both images are deleted in
           every namespace and collected, the artifact replica removed, and
           the bench checks no layer content, snapshot or replica is left

Each Run's stages come from its events and from the agent's runtime calls
(queue, decision, dispatch, artifact fetch, image pull + unpack, launch).
The floor, measured in the same run beside each Run, is the transfer of the
bytes the Run fetched through the same link (plain HTTP GETs of the blobs,
an object Get of the artifact), plus the adapter's EnsureImage (unpack only:
the content is on the machine by then) and Launch called directly.

The baseline calls the containerd adapter directly on the same daemon (its
own namespace): EnsureImage then Launch, until Launch returns a running
task, with the same warm and cold images, the same command and the same
network (a Run's default, the bridge, on the agent's bridge) (for the
sized images, presenting the registry account itself). The ratio is what warmfleet's
path (NATS, placement, commands, journal, reports, credentials) adds.`,
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runE2E(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.runs, "runs", 20, "timed Runs per case (warm, cold), and as many direct launches")
	f.StringSliceVar(&o.command, "command", []string{"true"}, "the container's command")
	f.IntVar(&o.sized.runs, "sized-runs", 3, "timed Runs per production-sized case (warm, partial, cold) per link speed (0 skips them)")
	f.IntVar(&o.sized.imageMiB, "image-mib", 2048, "the sized image's random bytes, in MiB")
	f.IntVar(&o.sized.layers, "image-layers", 6, "how many equal layers the image's random bytes are split into")
	f.IntVar(&o.sized.baseLayers, "base-layers", 4, "how many of those layers are a base shared with the partial case's variant")
	f.IntVar(&o.sized.artifactMiB, "artifact-mib", 2048, "the artifact every sized Run mounts, in MiB")
	f.StringSliceVar(&o.sized.cases, "cases", nil, "the production-sized cases to measure, of warm, partial and cold (default all)")
	f.StringVar(&o.sized.links, "link", "1000,100", "the node's link speeds to measure at, in Mbit/s, comma-separated")
	f.DurationVar(&o.gap, "gap", 500*time.Millisecond, "pause between one Run's end and the next submit (both sides), so the last container's teardown is not on the next one's clock")
	return cmd
}

func runE2E(ctx context.Context, g *globals, o e2eOpts) (*Report, error) {
	// nats.go bounds an object Get or Put by its default timeout when ctx
	// has no deadline, which a large artifact outlasts.
	ctx, cancel := context.WithTimeout(ctx, 6*time.Hour)
	defer cancel()
	if _, err := os.Stat(ociimage.BusyboxPath); err != nil {
		return nil, fmt.Errorf("%s missing (apt-get install -y busybox-static): %w", ociimage.BusyboxPath, err)
	}
	prof, err := newProfiler(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer prof.close()
	b := &e2eBench{o: o}
	defer b.cleanup.run()
	if err := b.start(ctx, g); err != nil {
		return nil, err
	}
	if err := prof.start(); err != nil {
		return nil, err
	}
	if err := b.warmUp(ctx); err != nil {
		return nil, err
	}
	busy, err := b.busyboxCases(ctx)
	if err != nil {
		return nil, err
	}
	var sized []*sizedResult
	if b.world != nil {
		if sized, err = b.sizedCases(ctx); err != nil {
			return nil, err
		}
	}
	prof.stop()
	return b.report(busy, sized)
}

// e2eBench is e2e's world: a private containerd holding the busybox images,
// the sized world (registry, link, artifact) when there are sized cases,
// NATS and the control plane, one agent on containerd (through the link
// when sized), the adapter called directly on the same daemon, and the
// client that submits Runs and follows them.
type e2eBench struct {
	o       e2eOpts
	cleanup undo

	cd                 *benchContainerd
	imgDir             string
	warm               ociimage.Image
	coldWF, coldDirect []ociimage.Image

	world *sizedWorld // nil without sized cases
	links []int
	art   benchArtifact

	e        *env
	images   *imageRecorder
	rt       *timedRuntime
	agentCfg agent.Config
	via      *bus.Conn // a bench connection through the link
	client   *bus.Conn
	runs     *e2eRunner
	direct   *containerd.Runtime
	nonce    string
}

// start brings everything up but the direct runtime; cleanup stops it.
func (b *e2eBench) start(ctx context.Context, g *globals) error {
	cd, err := startContainerd()
	if err != nil {
		return err
	}
	b.cd = cd
	b.cleanup.push(cd.stop)
	if err := b.buildImages(); err != nil {
		return err
	}
	if b.o.sized.runs > 0 {
		if err := b.startWorld(ctx); err != nil {
			return err
		}
	}
	cpCfg := controlplane.Config{OpenEnrollment: true}
	if b.world != nil {
		cpCfg.RegistryAuth = b.world.source
	}
	if b.e, err = startEnv(g, "e2e", cpCfg); err != nil {
		return err
	}
	b.cleanup.push(b.e.close)
	if err := b.startNode(); err != nil {
		return err
	}
	if b.client, err = b.e.connect("bench-client"); err != nil {
		return err
	}
	return nil
}

// buildImages builds the warm image and one cold image per Run and side.
func (b *e2eBench) buildImages() error {
	b.imgDir = filepath.Join(b.cd.Dir, "images")
	if err := os.MkdirAll(b.imgDir, 0o755); err != nil {
		return err
	}
	var err error
	if b.warm, err = ociimage.BuildBusybox(b.imgDir, "bench-warm", nil); err != nil {
		return err
	}
	cold := func(tag string) ([]ociimage.Image, error) {
		var out []ociimage.Image
		for i := range b.o.runs {
			img, err := ociimage.BuildBusybox(b.imgDir, "bench-cold", map[string]string{"/cold": tag + strconv.Itoa(i)})
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		}
		return out, nil
	}
	if b.coldWF, err = cold("warmfleet-"); err != nil {
		return err
	}
	b.coldDirect, err = cold("direct-")
	return err
}

// startWorld starts the sized cases' link and registry with its images.
func (b *e2eBench) startWorld(ctx context.Context) error {
	if err := b.o.sized.check(); err != nil {
		return err
	}
	b.links, _ = parseLinks(b.o.sized.links)
	dir := filepath.Join(b.cd.Dir, "registry")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	link, err := newShapedLink(b.links[0])
	if err != nil {
		return err
	}
	b.cleanup.push(link.close)
	if b.world, err = newSizedWorld(ctx, dir, b.warm, b.o.sized, link); err != nil {
		return fmt.Errorf("sized images: %w", err)
	}
	b.cleanup.push(b.world.stop)
	return nil
}

// startNode starts the agent on containerd. With sized cases the agent,
// and one bench connection for the transfer floor, reach NATS through the
// link.
func (b *e2eBench) startNode() error {
	b.images, b.rt = &imageRecorder{}, &timedRuntime{}
	b.agentCfg = agent.Config{NodeID: "bench-ctrd-1", ImageMetrics: b.images, DataDir: filepath.Join(b.e.dir, "agent-bench-ctrd-1")}
	if b.world == nil {
		_, stop, err := startContainerdAgent(b.e, b.cd, b.imgDir, "", b.agentCfg, nil)
		if err != nil {
			return err
		}
		b.cleanup.push(stop)
		return nil
	}
	natsVia, err := b.world.link.proxy(strings.TrimPrefix(b.e.url, "nats://"))
	if err != nil {
		return err
	}
	return b.e.through("nats://"+natsVia, func() error {
		if b.via, err = b.e.connect("bench-via-link"); err != nil {
			return err
		}
		_, stop, err := startContainerdAgent(b.e, b.cd, b.imgDir, "", b.agentCfg, func(r noderuntime.Runtime) noderuntime.Runtime { b.rt.Runtime = r; return b.rt })
		if err != nil {
			return err
		}
		b.cleanup.push(stop)
		return nil
	})
}

// warmUp starts the baseline, the adapter called directly in its own
// namespace on the agent's bridge (sharing its address leases, as
// runtimes on one bridge must), and brings the warm image into both sides
// with one untimed launch each.
func (b *e2eBench) warmUp(ctx context.Context) error {
	direct, err := containerd.New(ctx, containerd.Options{Address: b.cd.Address, Namespace: b.cd.Namespace + "-direct", ImageDir: b.imgDir,
		LogDir: filepath.Join(b.cd.Dir, "direct-logs"), StateDir: filepath.Join(b.cd.Dir, "direct-state"), Logger: b.e.log.Named("direct"),
		Network: containerd.NetworkOptions{IPAMDir: filepath.Join(b.agentCfg.DataDir, "runtime", "ipam")}})
	if err != nil {
		return err
	}
	b.direct = direct
	b.cleanup.push(func() { _ = direct.Close() })
	if _, err := directLaunch(ctx, direct, imageSpec(b.warm), "direct-warmup", b.o.command); err != nil {
		return fmt.Errorf("direct warm-up: %w", err)
	}
	w, err := watchRuns(b.client.NC)
	if err != nil {
		return err
	}
	b.cleanup.push(w.stop)
	b.runs = &e2eRunner{client: b.client, watch: w, command: b.o.command, logPath: filepath.Join(b.e.dir, "cp.log")}
	b.nonce = strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := b.runs.run(ctx, "e2e-"+b.nonce+"-warmup", b.warm.Reference, nil); err != nil {
		return fmt.Errorf("warm-up run: %w", err)
	}
	return nil
}

// e2eRunner submits Runs of the bench's command one at a time and follows
// each to its end, which must be success.
type e2eRunner struct {
	client  *bus.Conn
	watch   *runWatch
	command []string
	logPath string // the control plane's log, named when a Run fails
}

func (r *e2eRunner) run(ctx context.Context, rid, image string, arts []schemas.ArtifactUse) (runEnd, error) {
	req := runRequest(rid, image)
	req.Command, req.Artifacts = r.command, arts
	end, err := r.watch.run(ctx, r.client.JS, req, 30*time.Minute)
	if err != nil {
		return end, err
	}
	return end, end.succeeded(rid, r.logPath)
}

// directLaunch is the baseline: EnsureImage then Launch of the same
// container spec (with the Run's artifact mounts, when given, and its
// network: a Run's default is the bridge, whose setup any runtime that
// gives a container a network does), timed until Launch returns a running
// task; then the workload is waited for and removed.
func directLaunch(ctx context.Context, rt *containerd.Runtime, img noderuntime.ImageSpec, id string, command []string, mounts ...noderuntime.Mount) (time.Duration, error) {
	t0 := time.Now()
	if _, err := rt.EnsureImage(ctx, img); err != nil {
		return 0, err
	}
	// The spec the agent builds for the same Run (runRequest's env and
	// resources, its labels), so the two sides start the same container.
	req := runRequest(id, img.Reference)
	env := []string{"WARMFLEET_RUN_ID=" + id, "WARMFLEET_ATTEMPT_ID=" + id, "WARMFLEET_NODE_ID=direct"}
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	st, err := rt.Launch(ctx, noderuntime.WorkloadSpec{ID: id, ImageReference: img.Reference, ManifestDigest: img.ManifestDigest, Command: command,
		Env: env, Mounts: mounts, CPUMillis: req.Resources.CPUMillis, MemoryBytes: req.Resources.MemoryBytes,
		Network: noderuntime.NetworkMode(schemas.NetworkModeOf(req.Network)), ShmBytes: req.ShmBytes,
		Labels: map[string]string{agent.LabelRunID: id, agent.LabelAttemptID: id, agent.LabelMaxRuntime: strconv.FormatInt(req.MaxRuntimeSeconds, 10)}})
	if err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if st.State != noderuntime.WorkloadRunning {
		return 0, fmt.Errorf("direct launch %s: state %s", id, st.State)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := rt.Wait(wctx, id); err != nil {
		return 0, err
	}
	return d, rt.Remove(ctx, id)
}

// imageSpec is an OCI archive image as the agent ensures it.
func imageSpec(img ociimage.Image) noderuntime.ImageSpec {
	return noderuntime.ImageSpec{Reference: img.Reference, ManifestDigest: img.ManifestDigest, Unpack: true}
}
