package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/adapters/gpuprobe"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// fakeCards states NVIDIA cards with the given UUIDs and names each by the
// CDI devices the specs in dirs offer now, as the agent's real probe does
// (adapters/gpuprobe): with no spec for them, the cards have no CDI name.
func fakeCards(dirs []string, uuids ...string) agent.AcceleratorProbe {
	reg := cdispec.New(dirs, zap.NewNop())
	cards := make([]schemas.GPUCard, len(uuids))
	for i, u := range uuids {
		cards[i] = gpuprobe.FakeCard(i, u, "NVIDIA L4", 24<<30)
		cards[i].CDIDevices = nil
	}
	fake := gpuprobe.NewFakeCards(cards...)
	return agent.AcceleratorProbeFunc(func(ctx context.Context) schemas.AcceleratorFacts {
		f := fake.Probe(ctx)
		f.CDI = reg.Scan()
		gpuprobe.Annotate(&f)
		return f
	})
}

// gpuReport is what a GPU Run's container printed: the device nodes it sees
// and the UUIDs the agent told it it holds.
type gpuReport struct {
	devices []string
	uuids   string
}

// reportCache is the cache a GPU Run writes its report into: it outlives
// the container on its node.
var reportCache = []schemas.CacheMount{{Name: "gpu-report", Path: "/report"}}

// readGPUReport parses what run's attempt on n wrote to its report: lines
// "dev <name>" and "gpus <uuids>".
func readGPUReport(t *testing.T, n *node, r schemas.Run) gpuReport {
	t.Helper()
	b, err := os.ReadFile(n.cacheFile("gpu-report", r.AttemptID))
	if err != nil {
		t.Fatalf("read %s's output: %v", r.ID, err)
	}
	var rep gpuReport
	for _, line := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(line, "dev "); ok {
			rep.devices = append(rep.devices, d)
		}
		if g, ok := strings.CutPrefix(line, "gpus "); ok {
			rep.uuids = g
		}
	}
	slices.Sort(rep.devices)
	return rep
}

// gpuCommand reports the container's NVIDIA device nodes and its booked
// UUIDs into the report cache, then holds its cards: until the test
// creates the cache's release file when hold is set (at most two minutes),
// else not at all.
func gpuCommand(hold bool) []string {
	wait := ""
	if hold {
		wait = `; i=0; until [ -e /report/release ] || [ $i -ge 120 ]; do sleep 1; i=$((i+1)); done`
	}
	return []string{"sh", "-c", `{ for d in /dev/nvidia*; do [ -e "$d" ] && echo "dev $d"; done; echo "gpus $WARMFLEET_GPUS"; } > /report/$WARMFLEET_ATTEMPT_ID` + wait}
}

// TestAcceptance_GPUsDisjoint: three one-GPU Runs on a two-GPU node. Two run
// at once, each with exactly one card, a different one, told its UUID; the
// third starts only once one of them ends. A two-GPU Run sees both.
func TestAcceptance_GPUsDisjoint(t *testing.T) {
	w := newWorld(t)
	cdi := testenv.WriteCDIGPUs(t)
	f := newFleet(t)
	n := f.startAgent(agentSpec{id: "gpu-1", world: w, accelerator: fakeCards([]string{cdi.Dir}, cdi.UUIDs[0], cdi.UUIDs[1]), cdiDirs: []string{cdi.Dir}})

	var ids []string
	for _, req := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		ids = append(ids, f.submit(schemas.RunRequest{RequestID: req, Image: w.image.Reference, Command: gpuCommand(true), Caches: reportCache,
			Resources: schemas.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, GPUCount: 1}}))
	}
	// The cards are held until two Runs run at once, however long their
	// launches take; then they end, and the third may start.
	f.eventually(90*time.Second, "two of the Runs running", func() bool {
		running := 0
		for _, id := range ids {
			if r, ok := f.run(id); ok && r.Phase == schemas.PhaseRunning {
				running++
			}
		}
		return running >= 2
	})
	if err := os.WriteFile(n.cacheFile("gpu-report", "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var runs []schemas.Run
	for _, id := range ids {
		runs = append(runs, f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second))
	}
	byUUID := map[string]string{cdi.UUIDs[0]: "/dev/nvidia0", cdi.UUIDs[1]: "/dev/nvidia1"}
	for _, r := range runs {
		if len(r.GPUs) != 1 {
			t.Fatalf("%s holds GPUs %v, want one", r.ID, r.GPUs)
		}
		rep := readGPUReport(t, n, r)
		if want := []string{byUUID[r.GPUs[0]]}; !slices.Equal(rep.devices, want) || rep.uuids != r.GPUs[0] {
			t.Errorf("%s booked %v sees devices %v and UUIDs %q, want %v and %q", r.ID, r.GPUs, rep.devices, rep.uuids, want, r.GPUs[0])
		}
		booked := false
		for _, ev := range f.events(r.ID) {
			if slices.Equal(ev.GPUs, r.GPUs) { // the booking, or the start of a queued attempt
				booked = true
			}
		}
		if !booked {
			t.Errorf("%s's events never name its GPUs %v", r.ID, r.GPUs)
		}
	}
	// Order the three by start: the first two overlap on different cards,
	// the third starts only after one of them ended.
	slices.SortFunc(runs, func(a, b schemas.Run) int { return a.StartedAt.Compare(*b.StartedAt) })
	first, second, third := runs[0], runs[1], runs[2]
	if !second.StartedAt.Before(*first.FinishedAt) {
		t.Errorf("the first two did not run at once: %s ran %v–%v, %s started %v", first.ID, first.StartedAt, first.FinishedAt, second.ID, second.StartedAt)
	}
	if first.GPUs[0] == second.GPUs[0] {
		t.Errorf("%s and %s ran at once on the same card %s", first.ID, second.ID, first.GPUs[0])
	}
	if ended := min(first.FinishedAt.UnixNano(), second.FinishedAt.UnixNano()); third.StartedAt.UnixNano() < ended {
		t.Errorf("%s started at %v, before either card was free (%v)", third.ID, third.StartedAt, time.Unix(0, ended))
	}

	both := f.waitPhase(f.submit(schemas.RunRequest{RequestID: "gpu-both", Image: w.image.Reference, Command: gpuCommand(false), Caches: reportCache,
		Resources: schemas.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, GPUCount: 2}}), schemas.PhaseSucceeded, 60*time.Second)
	rep := readGPUReport(t, n, both)
	if !slices.Equal(rep.devices, []string{"/dev/nvidia0", "/dev/nvidia1"}) || len(both.GPUs) != 2 || rep.uuids != strings.Join(both.GPUs, ",") {
		t.Errorf("a two-GPU Run holds %v and sees devices %v, UUIDs %q; want both cards", both.GPUs, rep.devices, rep.uuids)
	}
}

// TestAcceptance_GPUHostWithoutCDIRefused: a node whose facts list cards but
// whose host has no usable CDI spec for them (here only a malformed one,
// reported in its facts) takes no GPU Run: it fails with the reason code,
// never runs without its GPUs. The agent keeps running, and a CPU Run
// still runs there.
func TestAcceptance_GPUHostWithoutCDIRefused(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	bad := testenv.WriteMalformedCDISpec(t, dir)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "no-cdi", world: w, accelerator: fakeCards([]string{dir}, "GPU-aaaaaaaa-0000-0000-0000-000000000001"), cdiDirs: []string{dir}})
	f.eventually(20*time.Second, "the malformed spec in no-cdi's facts", func() bool {
		rec := f.nodeRecord("no-cdi")
		return rec.Facts != nil && slices.ContainsFunc(rec.Facts.Host.Accelerator.CDI.Errors, func(e schemas.CDISpecError) bool { return e.Path == bad })
	})

	gpu := f.waitPhase(f.submit(schemas.RunRequest{RequestID: "needs-cdi", Image: w.image.Reference, Command: gpuCommand(false),
		Resources: schemas.Resources{GPUCount: 1}}), schemas.PhaseFailed, 30*time.Second)
	if gpu.Reason != string(schemas.CodeUnsatisfiable) || gpu.NodeID != "" {
		t.Errorf("GPU Run ended %s (%s) on %q, want failed unsatisfiable without a node", gpu.Phase, gpu.Reason, gpu.NodeID)
	}
	if c := candidate(f.decision(gpu.ID), "no-cdi"); c.Reason != schemas.ReasonGPUNotInjectable {
		t.Errorf("no-cdi rejected for %q (%s), want %s", c.Reason, c.Detail, schemas.ReasonGPUNotInjectable)
	}
	f.waitPhase(f.submit(schemas.RunRequest{RequestID: "cpu-only", Image: w.image.Reference, Command: []string{"true"}}), schemas.PhaseSucceeded, 60*time.Second)
}

// TestAcceptance_SessionsCountInPlacement: a resident session holding a
// node's only GPU keeps a GPU Run off that node; the Run takes the other
// node's card.
func TestAcceptance_SessionsCountInPlacement(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	dirs := []string{t.TempDir()}
	writeCDISpecFor(t, dirs[0], "GPU-5e551011-0000-0000-0000-000000000001", "GPU-5e551011-0000-0000-0000-000000000002")
	f.startSessionNode(sessionNodeSpec{id: "sess-a", ledger: l, accelerator: fakeCards(dirs, "GPU-5e551011-0000-0000-0000-000000000001")})
	f.startSessionNode(sessionNodeSpec{id: "sess-b", ledger: l, accelerator: fakeCards(dirs, "GPU-5e551011-0000-0000-0000-000000000002")})
	f.eventually(20*time.Second, "both nodes' cards in facts", func() bool {
		for _, id := range []string{"sess-a", "sess-b"} {
			rec := f.nodeRecord(id)
			if rec.Facts == nil || len(rec.Facts.Host.Accelerator.Cards) != 1 || len(rec.Facts.Host.Accelerator.Cards[0].CDIDevices) == 0 {
				return false
			}
		}
		return true
	})

	rv := f.attachSession(schemas.SessionRequest{Tenant: "acme", Session: "gpu-holder", Node: "sess-a", GPUCount: 1})
	if rv.Host != "sess-a" {
		t.Fatalf("session resident on %s, want sess-a", rv.Host)
	}
	f.eventually(10*time.Second, "the session's card in wf_residency", func() bool {
		routes, err := sessions.ListRoutes(context.Background(), f.conn.JS)
		return err == nil && slices.ContainsFunc(routes, func(o residency.Observation) bool {
			return o.Session == "gpu-holder" && o.Holds() && slices.Equal(o.GPUs, []string{"GPU-5e551011-0000-0000-0000-000000000001"})
		})
	})
	if rep := f.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: "acme", Session: "second", Node: "sess-a", GPUCount: 1}); rep.Error == nil || rep.Error.Code != residency.CodeCapacity {
		t.Errorf("a second GPU session on sess-a: %+v, want a capacity refusal", rep.Error)
	}

	id := f.submit(schemas.RunRequest{RequestID: "gpu-beside-session", Image: noopImage, Resources: schemas.Resources{GPUCount: 1}})
	f.eventually(30*time.Second, "the GPU Run booked", func() bool {
		r, ok := f.run(id)
		return ok && r.NodeID != ""
	})
	r, _ := f.run(id)
	if r.NodeID != "sess-b" || !slices.Equal(r.GPUs, []string{"GPU-5e551011-0000-0000-0000-000000000002"}) {
		t.Errorf("GPU Run booked on %s with %v; want sess-b's card, sess-a's is the session's", r.NodeID, r.GPUs)
	}
	if c := candidate(f.decision(id), "sess-a"); c.NodeID == "" || c.Eligible && c.Components.QueueSeconds == 0 {
		t.Errorf("sess-a's candidate %+v: its only card is the session's, so it could at best queue", c)
	}
}

// writeCDISpecFor writes a CDI spec into dir offering each UUID as
// nvidia.com/gpu=<uuid> (no device nodes: the node's runtime runs nothing).
func writeCDISpecFor(t *testing.T, dir string, uuids ...string) {
	t.Helper()
	spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
	for _, u := range uuids {
		spec += "  - name: " + u + "\n    containerEdits:\n      env: [\"NVIDIA_VISIBLE_DEVICES=" + u + "\"]\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}
