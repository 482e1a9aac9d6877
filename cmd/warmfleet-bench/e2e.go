package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runE2E(cmd.Context(), g, o)
			if err != nil {
				return err
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
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
	cd, err := startContainerd()
	if err != nil {
		return nil, err
	}
	defer cd.stop()
	imgDir := filepath.Join(cd.Dir, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, err
	}
	warm, err := ociimage.BuildBusybox(imgDir, "bench-warm", nil)
	if err != nil {
		return nil, err
	}
	coldImages := func(tag string) ([]ociimage.Image, error) {
		var out []ociimage.Image
		for i := range o.runs {
			img, err := ociimage.BuildBusybox(imgDir, "bench-cold", map[string]string{"/cold": tag + strconv.Itoa(i)})
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		}
		return out, nil
	}
	coldWF, err := coldImages("warmfleet-")
	if err != nil {
		return nil, err
	}
	coldDirect, err := coldImages("direct-")
	if err != nil {
		return nil, err
	}

	var (
		world *sizedWorld
		links []int
	)
	if o.sized.runs > 0 {
		if err := o.sized.check(); err != nil {
			return nil, err
		}
		links, _ = parseLinks(o.sized.links)
		dir := filepath.Join(cd.Dir, "registry")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		link, err := newShapedLink(links[0])
		if err != nil {
			return nil, err
		}
		defer link.close()
		if world, err = newSizedWorld(ctx, dir, warm, o.sized, link); err != nil {
			return nil, fmt.Errorf("sized images: %w", err)
		}
		defer world.stop()
	}

	e, err := newEnv(g, "e2e")
	if err != nil {
		return nil, err
	}
	defer e.close()
	cpCfg := controlplane.Config{OpenEnrollment: true}
	if world != nil {
		cpCfg.RegistryAuth = world.source
	}
	if err := e.startCP(cpCfg); err != nil {
		return nil, err
	}
	imageTimes := &imageRecorder{}
	rt := &timedRuntime{}
	agentCfg := agent.Config{NodeID: "bench-ctrd-1", ImageMetrics: imageTimes, DataDir: filepath.Join(e.dir, "agent-bench-ctrd-1")}
	var via *bus.Conn
	if world != nil {
		// The agent, and one bench connection for the transfer floor,
		// reach NATS through the link: connections made while e.url names
		// the link's proxy.
		natsVia, err := world.link.proxy(strings.TrimPrefix(e.url, "nats://"))
		if err != nil {
			return nil, err
		}
		direct := e.url
		e.url = "nats://" + natsVia
		via, err = e.connect("bench-via-link")
		if err == nil {
			_, stopAgent, err := startContainerdAgent(e, cd, imgDir, "", agentCfg, func(r noderuntime.Runtime) noderuntime.Runtime { rt.Runtime = r; return rt })
			if err == nil {
				defer stopAgent()
			}
		}
		e.url = direct
		if err != nil {
			return nil, err
		}
	} else {
		_, stopAgent, err := startContainerdAgent(e, cd, imgDir, "", agentCfg, nil)
		if err != nil {
			return nil, err
		}
		defer stopAgent()
	}
	client, err := e.connect("bench-client")
	if err != nil {
		return nil, err
	}
	if err := prof.start(); err != nil {
		return nil, err
	}

	// Baseline: the adapter called directly, in its own namespace, on the
	// agent's bridge (sharing its address leases, as runtimes on one
	// bridge must).
	direct, err := containerd.New(ctx, containerd.Options{Address: cd.Address, Namespace: cd.Namespace + "-direct", ImageDir: imgDir,
		LogDir: filepath.Join(cd.Dir, "direct-logs"), StateDir: filepath.Join(cd.Dir, "direct-state"), Logger: e.log.Named("direct"),
		Network: containerd.NetworkOptions{IPAMDir: filepath.Join(agentCfg.DataDir, "runtime", "ipam")}})
	if err != nil {
		return nil, err
	}
	defer direct.Close()
	if _, err := directLaunch(ctx, direct, imageSpec(warm), "direct-warmup", o.command); err != nil {
		return nil, fmt.Errorf("direct warm-up: %w", err)
	}
	// warmfleet: one untimed Run imports the warm image.
	w, err := watchRuns(client.NC)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.sub.Unsubscribe() }()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	// send publishes one Run and waits for its end; submit times it.
	send := func(rid, image string, arts []schemas.ArtifactUse) (t0, acc time.Time, ph, seen map[schemas.Phase]time.Time, err error) {
		req := runRequest(rid, image)
		req.Command, req.Artifacts = o.command, arts
		m, err := submitMsg(req, codec.JSON)
		if err != nil {
			return t0, acc, nil, nil, err
		}
		t0 = time.Now()
		if _, err := client.JS.PublishMsg(ctx, m, jetstream.WithMsgID(rid)); err != nil {
			return t0, acc, nil, nil, err
		}
		ph, seen, acc, err = w.waitTerminal(ctx, schemas.RunIDFor(rid), 30*time.Minute)
		if err != nil {
			return t0, acc, nil, nil, err
		}
		if _, ok := ph[schemas.PhaseSucceeded]; !ok {
			return t0, acc, nil, nil, fmt.Errorf("run %s did not succeed (phases %v); see %s", rid, keys(ph), filepath.Join(e.dir, "cp.log"))
		}
		return t0, acc, ph, seen, nil
	}
	submit := func(rid, image string) (*runTimings, error) {
		t := &runTimings{byStage: map[string][]time.Duration{}}
		t0, acc, ph, seen, err := send(rid, image, nil)
		if err != nil {
			return nil, err
		}
		t.add(t0, acc, ph, seen)
		return t, nil
	}
	if _, err := submit("e2e-"+nonce+"-warmup", warm.Reference); err != nil {
		return nil, fmt.Errorf("warm-up run: %w", err)
	}

	// Timed: direct and warmfleet alternate, run by run, so the machine's
	// noise falls on both alike.
	var directWarm, directCold []time.Duration
	warmT := &runTimings{byStage: map[string][]time.Duration{}}
	coldT := &runTimings{byStage: map[string][]time.Duration{}}
	for i := range o.runs {
		time.Sleep(o.gap)
		d, err := directLaunch(ctx, direct, imageSpec(warm), "direct-warm-"+strconv.Itoa(i), o.command)
		if err != nil {
			return nil, err
		}
		directWarm = append(directWarm, d)
		time.Sleep(o.gap)
		t, err := submit(fmt.Sprintf("e2e-%s-warm-%03d", nonce, i), warm.Reference)
		if err != nil {
			return nil, err
		}
		warmT.merge(t)
	}
	for i := range o.runs {
		time.Sleep(o.gap)
		d, err := directLaunch(ctx, direct, imageSpec(coldDirect[i]), "direct-cold-"+strconv.Itoa(i), o.command)
		if err != nil {
			return nil, err
		}
		directCold = append(directCold, d)
		time.Sleep(o.gap)
		t, err := submit(fmt.Sprintf("e2e-%s-cold-%03d", nonce, i), coldWF[i].Reference)
		if err != nil {
			return nil, err
		}
		coldT.merge(t)
	}
	var sized []*sizedResult
	var art benchArtifact
	if world != nil {
		rec, err := putArtifact(ctx, client, o.sized.artifactMiB)
		if err != nil {
			return nil, err
		}
		art = benchArtifact{rec: rec, storeDir: filepath.Join(agentCfg.DataDir, "artifacts")}
		sr := &sizedRun{o: o.sized, gap: o.gap, nonce: nonce, cd: cd, direct: direct, world: world, art: art, via: via, rt: rt, submit: send, command: o.command}
		// Untimed: the image and artifact brought in over a fast link, so
		// the first speed's warm case starts warm; and the direct side's.
		world.link.setRate(100_000)
		if _, _, _, _, err := send("e2e-"+nonce+"-sized-warmup", world.a.via.String(), sr.uses()); err != nil {
			return nil, fmt.Errorf("sized warm-up run: %w", err)
		}
		if _, err := directLaunch(ctx, direct, world.directSpec(world.a), "direct-sized-warmup", o.command); err != nil {
			return nil, fmt.Errorf("direct sized warm-up: %w", err)
		}
		for _, mbit := range links {
			res, err := sr.run(ctx, mbit)
			if err != nil {
				return nil, fmt.Errorf("at %d Mbit/s: %w", mbit, err)
			}
			sized = append(sized, res)
		}
	}
	prof.stop()

	rep := newReport("e2e")
	dw, dc := summarise(directWarm), summarise(directCold)
	ws, cs := summarise(warmT.submitToRunning), summarise(coldT.submitToRunning)
	rep.add("warm: submit → running p50", ws.P50, "ms", dw.P50, "containerd adapter direct, warm p50")
	rep.add("cold: submit → running p50", cs.P50, "ms", dc.P50, "containerd adapter direct, cold p50")
	rep.add("cold − warm p50 (image import + unpack)", cs.P50-ws.P50, "ms", dc.P50-dw.P50, "direct cold − warm")
	rep.Details["warm_stages"] = warmT.stages()
	rep.Details["cold_stages"] = coldT.stages()
	rep.Details["direct_warm"] = dw
	rep.Details["direct_cold"] = dc
	rep.note("warm stages p50: %s", stageTable(warmT.stages()))
	rep.note("cold stages p50: %s", stageTable(coldT.stages()))
	rep.note("%d Runs per case, one at a time, %s apart, alternating direct and warmfleet; command %q; image %d-byte OCI archive of busybox-static", o.runs, o.gap, o.command, warm.SizeBytes)
	if world != nil {
		reportSized(rep, o.sized, world, art, sized)
		creds, _, failed := imageTimes.snapshot()
		if failed > 0 {
			return nil, fmt.Errorf("%d registry credential asks failed", failed)
		}
		cs := summarise(creds)
		rep.Details["registry_credential_asks"] = cs
		rep.note("registry credential asks: %d, p50 %.2f ms (one per pull that fetched)", cs.N, cs.P50)
	}
	return rep, nil
}

func (r *runTimings) merge(o *runTimings) {
	r.submitToRunning = append(r.submitToRunning, o.submitToRunning...)
	r.placedToRunning = append(r.placedToRunning, o.placedToRunning...)
	for k, v := range o.byStage {
		r.byStage[k] = append(r.byStage[k], v...)
	}
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

// startContainerdAgent runs a real agent on the containerd runtime and waits
// until the registry holds its session, in containerd namespace ns (the
// daemon's Namespace when empty; another must be one startContainerd was
// given). cfg's NodeID is required; its DataDir, ContentRoot, StopGrace and
// Generation are filled in when unset. wrap, when given, wraps the runtime
// the agent sees.
func startContainerdAgent(e *env, cd *benchContainerd, imgDir, ns string, cfg agent.Config, wrap func(noderuntime.Runtime) noderuntime.Runtime) (*agent.Agent, func(), error) {
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(e.dir, "agent-"+cfg.NodeID)
	}
	if cfg.ContentRoot == "" {
		cfg.ContentRoot = cd.Root
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 2 * time.Second
	}
	if cfg.Generation == 0 {
		cfg.Generation = 1
	}
	if ns == "" {
		ns = cd.Namespace
	}
	rt, err := containerd.New(context.Background(), containerd.Options{Address: cd.Address, Namespace: ns, ImageDir: imgDir,
		LogDir: filepath.Join(cfg.DataDir, "logs"), StateDir: filepath.Join(cfg.DataDir, "runtime"), Logger: e.log.Named("containerd")})
	if err != nil {
		return nil, nil, err
	}
	var seen noderuntime.Runtime = rt
	if wrap != nil {
		seen = wrap(rt)
	}
	return startAgent(e, cfg, seen, func() { removeLeft(rt, e.log); _ = rt.Close() })
}

// removeLeft removes the workloads a stopped agent had not removed yet (the
// last Run's, whose removal follows its exit report), so no namespace,
// veth, address lease or masquerade rule of the bench outlives it.
func removeLeft(rt *containerd.Runtime, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := rt.List(ctx)
	if err != nil {
		log.Warn("list workloads left by the agent", zap.Error(err))
		return
	}
	for _, st := range left {
		if err := rt.Remove(ctx, st.ID); err != nil {
			log.Warn("remove a workload left by the agent", zap.String("workload", st.ID), zap.Error(err))
		}
	}
}
