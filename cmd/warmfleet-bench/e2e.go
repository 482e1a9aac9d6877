package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	digest "github.com/opencontainers/go-digest"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
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
	// The private-registry case: a large image pulled cold from
	// docker-registry behind htpasswd, registryRuns times (0: skipped).
	registryRuns, registryMiB, registryLayers int
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

  private  a large image (busybox plus --registry-mib of random layers, as
        incompressible as model weights) in a private docker-registry on
        loopback with htpasswd; the control plane holds the account (as
        serve --registry-auth does) and the agent asks for it at pull time.
        Before each timed pull the image is deleted and collected, so every
        pull fetches every byte. The agent's credential asks are timed
        beside its fetches.

The baseline calls the containerd adapter directly on the same daemon (its
own namespace): EnsureImage then Launch, until Launch returns a running
task, with the same warm and cold images and the same command (for the
private image, presenting the account itself). The ratio is what warmfleet's
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
	f.IntVar(&o.registryRuns, "registry-runs", 3, "timed cold pulls of the private image, each side (0 skips the case)")
	f.IntVar(&o.registryMiB, "registry-mib", 1024, "size of the private image's random layers, in MiB")
	f.IntVar(&o.registryLayers, "registry-layers", 4, "how many layers the random MiB are split into")
	f.DurationVar(&o.gap, "gap", 500*time.Millisecond, "pause between one Run's end and the next submit (both sides), so the last container's teardown is not on the next one's clock")
	return cmd
}

func runE2E(ctx context.Context, g *globals, o e2eOpts) (*Report, error) {
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

	var private *privateImage
	if o.registryRuns > 0 {
		if o.registryLayers < 1 || o.registryMiB < o.registryLayers {
			return nil, fmt.Errorf("--registry-mib %d over --registry-layers %d: give at least one layer of at least 1 MiB", o.registryMiB, o.registryLayers)
		}
		dir := filepath.Join(cd.Dir, "registry")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if private, err = newPrivateImage(ctx, dir, warm, o.registryMiB, o.registryLayers); err != nil {
			return nil, fmt.Errorf("private registry: %w", err)
		}
		defer private.stop()
	}

	e, err := newEnv(g, "e2e")
	if err != nil {
		return nil, err
	}
	defer e.close()
	cpCfg := controlplane.Config{OpenEnrollment: true}
	if private != nil {
		cpCfg.RegistryAuth = private.source
	}
	if err := e.startCP(cpCfg); err != nil {
		return nil, err
	}
	imageTimes := &imageRecorder{}
	_, stopAgent, err := startContainerdAgent(e, cd, imgDir, "", agent.Config{NodeID: "bench-ctrd-1", ImageMetrics: imageTimes}, nil)
	if err != nil {
		return nil, err
	}
	defer stopAgent()
	client, err := e.connect("bench-client")
	if err != nil {
		return nil, err
	}
	if err := prof.start(); err != nil {
		return nil, err
	}

	// Baseline: the adapter called directly, in its own namespace.
	direct, err := containerd.New(ctx, containerd.Options{Address: cd.Address, Namespace: cd.Namespace + "-direct", ImageDir: imgDir,
		LogDir: filepath.Join(cd.Dir, "direct-logs"), StateDir: filepath.Join(cd.Dir, "direct-state"), Logger: zap.NewNop()})
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
	submit := func(rid, image string) (*runTimings, error) {
		t := &runTimings{byStage: map[string][]time.Duration{}}
		req := runRequest(rid, image)
		req.Command = o.command
		m, err := submitMsg(req, codec.JSON)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := client.JS.PublishMsg(ctx, m, jetstream.WithMsgID(rid)); err != nil {
			return nil, err
		}
		ph, seen, acc, err := w.waitTerminal(ctx, schemas.RunIDFor(rid), 600*time.Second)
		if err != nil {
			return nil, err
		}
		if _, ok := ph[schemas.PhaseSucceeded]; !ok {
			return nil, fmt.Errorf("run %s did not succeed (phases %v); see %s", rid, keys(ph), filepath.Join(e.dir, "cp.log"))
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
	// Private: the same large image, deleted and collected before each
	// pull on either side.
	var directPrivate []time.Duration
	privateT := &runTimings{byStage: map[string][]time.Duration{}}
	for i := range o.registryRuns {
		spec := noderuntime.ImageSpec{Reference: private.ref.String(), ManifestDigest: private.ref.Digest, Unpack: true, Credentials: private.credentials}
		if err := dropImage(ctx, cd.Address, digest.Digest(private.ref.Digest), cd.Namespace, cd.Namespace+"-direct"); err != nil {
			return nil, err
		}
		time.Sleep(o.gap)
		d, err := directLaunch(ctx, direct, spec, "direct-private-"+strconv.Itoa(i), o.command)
		if err != nil {
			return nil, fmt.Errorf("direct private pull: %w", err)
		}
		directPrivate = append(directPrivate, d)
		if err := dropImage(ctx, cd.Address, digest.Digest(private.ref.Digest), cd.Namespace, cd.Namespace+"-direct"); err != nil {
			return nil, err
		}
		time.Sleep(o.gap)
		t, err := submit(fmt.Sprintf("e2e-%s-private-%03d", nonce, i), private.ref.String())
		if err != nil {
			return nil, err
		}
		privateT.merge(t)
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
	if private != nil {
		creds, fetches, failed := imageTimes.snapshot()
		if failed > 0 || len(creds) != o.registryRuns || len(fetches) != o.registryRuns {
			return nil, fmt.Errorf("private pulls: %d credential asks answered (%d failed) and %d registry fetches for %d Runs, want one each", len(creds), failed, len(fetches), o.registryRuns)
		}
		ps, dp := summarise(privateT.submitToRunning), summarise(directPrivate)
		cs, fs := summarise(creds), summarise(fetches)
		rep.add("private: submit → running p50", ps.P50, "ms", dp.P50, "containerd adapter direct, same pull p50")
		rep.add("private: credential ask p50", cs.P50, "ms", fs.P50, "the agent's registry fetch + unpack p50")
		rep.Details["private_stages"] = privateT.stages()
		rep.Details["private_direct"] = dp
		rep.Details["private_credential_asks"] = cs
		rep.Details["private_fetches"] = fs
		rep.note("private: a credential ask is %.3f %% of its pull (p50 %.2f ms of %.0f ms)", 100*cs.P50/fs.P50, cs.P50, fs.P50)
		rep.note("private stages p50: %s", stageTable(privateT.stages()))
		rep.note("private image: %d MiB in %d random layers + busybox (%d bytes compressed), %d cold pulls per side from docker-registry (htpasswd) on loopback; the agent's fetch + unpack p50 is %.0f MiB/s",
			o.registryMiB, o.registryLayers, private.bytes, o.registryRuns, float64(private.bytes)/(1<<20)/(fs.P50/1000))
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
// container spec, timed until Launch returns a running task; then the
// workload is waited for and removed.
func directLaunch(ctx context.Context, rt *containerd.Runtime, img noderuntime.ImageSpec, id string, command []string) (time.Duration, error) {
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
		Env: env, CPUMillis: req.Resources.CPUMillis, MemoryBytes: req.Resources.MemoryBytes,
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
	return startAgent(e, cfg, seen, func() { _ = rt.Close() })
}
