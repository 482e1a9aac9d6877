package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// storedOutput is what WF_LOGS holds for one Run, checked chunk by chunk.
type storedOutput struct {
	// bytes are each (attempt, stream)'s bytes in offset order.
	bytes map[[2]string][]byte
	// duplicates counts chunks stored more than once or overlapping others.
	duplicates int
	// gaps counts chunks that start past the end of what came before.
	gaps int
	// ended holds the length each closing message stated.
	ended map[[2]string]int64
	nodes map[string]bool
}

// stored reads every chunk WF_LOGS holds for runID, straight from the
// stream: a second copy of a chunk counts as a duplicate here even though
// readers would skip it. The Run may be any tenant's: Run ids differ
// across tenants.
func (f *fleet) stored(runID string) storedOutput {
	f.t.Helper()
	return f.storedOn(bus.RunLogsSubject("*", runID))
}

// storedOn reads every chunk WF_LOGS holds on subject.
func (f *fleet) storedOn(subject string) storedOutput {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := storedOutput{bytes: map[[2]string][]byte{}, ended: map[[2]string]int64{}, nodes: map[string]bool{}}
	c, err := f.conn.JS.OrderedConsumer(ctx, bus.StreamLogs, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for left := info.NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			f.t.Fatalf("read %s: %v", subject, err)
		}
		h := m.Headers()
		key := [2]string{h.Get(bus.HeaderLogAttempt), h.Get(bus.HeaderLogStream)}
		out.nodes[h.Get(bus.HeaderLogNode)] = true
		if end := h.Get(bus.HeaderLogEnd); end != "" {
			n, _ := strconv.ParseInt(end, 10, 64)
			out.ended[key] = n
			continue
		}
		off, err := strconv.ParseInt(h.Get(bus.HeaderLogOffset), 10, 64)
		if err != nil {
			f.t.Fatalf("chunk without an offset: %v", h)
		}
		have := int64(len(out.bytes[key]))
		switch {
		case off < have:
			out.duplicates++
		case off > have:
			out.gaps++
		default:
			out.bytes[key] = append(out.bytes[key], m.Data()...)
		}
	}
	return out
}

// numbered checks that b is exactly the lines "<prefix> 1" .. "<prefix> n".
func numbered(b []byte, prefix string, n int) error {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != n {
		return fmt.Errorf("%d lines, want %d (first %q, last %q)", len(lines), n, lines[0], lines[len(lines)-1])
	}
	for i, l := range lines {
		if want := prefix + " " + strconv.Itoa(i+1); l != want {
			return fmt.Errorf("line %d is %q, want %q", i, l, want)
		}
	}
	return nil
}

// printer prints n numbered lines to stdout and to stderr, interleaved.
func printer(n int, pause string) []string {
	return []string{"sh", "-c", fmt.Sprintf(`seq 1 %d | while read i; do echo "out $i"; echo "err $i" >&2; %s done`, n, pause)}
}

// TestAcceptance_RunLogs: a Run prints 100,000 numbered lines to stdout and
// to stderr; WF_LOGS holds every one once, in order, per stream, each
// stream closed with its length, as soon as the Run's phase is terminal.
func TestAcceptance_RunLogs(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	node := f.startAgent(agentSpec{id: "node-a", world: w})
	const n = 100_000
	id := f.submit(schemas.RunRequest{RequestID: "logs-100k", Image: w.image.Reference, Command: printer(n, "")})
	f.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)

	got := f.stored(id)
	attempt := schemas.WorkloadID(id, 1)
	if got.duplicates != 0 || got.gaps != 0 {
		t.Fatalf("%d duplicate and %d gapped chunks stored", got.duplicates, got.gaps)
	}
	for stream, prefix := range map[string]string{bus.LogStdout: "out", bus.LogStderr: "err"} {
		key := [2]string{attempt, stream}
		if err := numbered(got.bytes[key], prefix, n); err != nil {
			t.Errorf("%s: %v", stream, err)
		}
		if end, ok := got.ended[key]; !ok || end != int64(len(got.bytes[key])) {
			t.Errorf("%s closed at %d (%v), holds %d bytes", stream, end, ok, len(got.bytes[key]))
		}
	}
	if !got.nodes["node-a"] || len(got.nodes) != 1 {
		t.Errorf("chunks name nodes %v, want node-a", got.nodes)
	}

	// What a user types: `warmfleet run logs` gives every line, once, in
	// order, stdout to stdout and stderr to stderr.
	cli := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")
	wf := f.cli(cli)
	stdout, stderr := f.runLogs(cli, id)
	if err := numbered(stdout.Bytes(), "out", n); err != nil {
		t.Errorf("run logs stdout: %v", err)
	}
	if err := numbered(stderr.Bytes(), "err", n); err != nil {
		t.Errorf("run logs stderr: %v", err)
	}
	if out, err := wf("run", "logs", id, "--stream", "stderr", "--tail", "3").CombinedOutput(); err != nil || string(out) != "err 99998\nerr 99999\nerr 100000\n" {
		t.Errorf("run logs --stream stderr --tail 3: %q %v", out, err)
	}

	// -f on a running Run prints lines as they come and exits when the Run
	// ends. The Run ends only once the test has read its first line from -f
	// (it creates /ctl/stop then; at most two minutes), however slowly -f
	// starts here.
	live := f.submit(schemas.RunRequest{RequestID: "logs-follow", Image: w.image.Reference, Caches: []schemas.CacheMount{{Name: "follow-ctl", Path: "/ctl"}},
		Command: []string{"sh", "-c", `for i in 1 2 3 4 5; do echo "tick $i"; sleep 1; done; i=0; until [ -e /ctl/stop ] || [ $i -ge 120 ]; do sleep 1; i=$((i+1)); done`}})
	stop := node.cacheFile("follow-ctl", "stop")
	f.waitPhase(live, schemas.PhaseRunning, 60*time.Second)
	follow := wf("run", "logs", "-f", live)
	pipe, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	var firstAt time.Time
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		if firstAt.IsZero() {
			firstAt = time.Now()
			if err := os.WriteFile(stop, nil, 0o644); err != nil {
				t.Error(err)
			}
		}
		lines = append(lines, sc.Text())
	}
	exited := time.Now()
	if err := follow.Wait(); err != nil {
		t.Fatalf("run logs -f: %v", err)
	}
	r, _ := f.run(live)
	if want := "tick 1,tick 2,tick 3,tick 4,tick 5"; strings.Join(lines, ",") != want {
		t.Fatalf("run logs -f printed %q, want %q", lines, want)
	}
	if r.Phase != schemas.PhaseSucceeded || r.FinishedAt == nil || !firstAt.Before(*r.FinishedAt) {
		t.Fatalf("the first line came at %v, the Run (%s) finished at %v: -f did not stream live", firstAt, r.Phase, r.FinishedAt)
	}
	if exited.Sub(*r.FinishedAt) > 15*time.Second {
		t.Fatalf("-f exited %s after the Run finished", exited.Sub(*r.FinishedAt))
	}

	// A failed Run's last lines are in `run get`.
	failed := f.submit(schemas.RunRequest{RequestID: "logs-failed", Image: w.image.Reference, Command: []string{"sh", "-c", "echo hello from warmfleet; exit 3"}})
	f.waitPhase(failed, schemas.PhaseFailed, 60*time.Second)
	if out, err := wf("run", "get", failed).CombinedOutput(); err != nil || !strings.Contains(string(out), "hello from warmfleet") {
		t.Fatalf("run get of a failed Run shows no last lines:\n%s (%v)", out, err)
	}
}

// TestAcceptance_LogsSurviveAgentKill: the agent process is killed with
// SIGKILL while a Run prints; the shim's log writer keeps the output, and
// the restarted agent ships the rest from its journal: every line is
// stored exactly once.
func TestAcceptance_LogsSurviveAgentKill(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet-agent")
	dataDir := tempDir(t)
	// The Run below uses host networking.
	start := func(name string) *exec.Cmd {
		return f.startAgentProcess(bin, w, "node-k", dataDir, name, "--allow-host-network")
	}
	first := start("agent-1")
	const n = 20_000
	// Two seconds of printing, a pause, then the rest.
	id := f.submit(schemas.RunRequest{RequestID: "logs-kill", Image: w.image.Reference, Network: schemas.NetworkHost,
		Command: []string{"sh", "-c", fmt.Sprintf(`seq 1 %d | while read i; do echo "out $i"; echo "err $i" >&2; [ $((i %% 2000)) = 0 ] && sleep 1; done`, n)}})
	f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
	f.eventually(30*time.Second, "some output stored", func() bool {
		return len(f.stored(id).bytes[[2]string{schemas.WorkloadID(id, 1), bus.LogStdout}]) > 0
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	time.Sleep(3 * time.Second) // the Run prints on while no agent runs
	start("agent-2")
	f.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)

	got := f.stored(id)
	if got.duplicates != 0 || got.gaps != 0 {
		t.Fatalf("%d duplicate and %d gapped chunks stored across the kill", got.duplicates, got.gaps)
	}
	for stream, prefix := range map[string]string{bus.LogStdout: "out", bus.LogStderr: "err"} {
		key := [2]string{schemas.WorkloadID(id, 1), stream}
		if err := numbered(got.bytes[key], prefix, n); err != nil {
			t.Errorf("%s: %v", stream, err)
		}
		if end, ok := got.ended[key]; !ok || end != int64(len(got.bytes[key])) {
			t.Errorf("%s closed at %d (%v), holds %d bytes", stream, end, ok, len(got.bytes[key]))
		}
	}
}

// startAgentProcess starts the agent binary bin as node nodeID on w's
// containerd, logging to a file shown when the test fails; the test's end
// stops it unless the test killed it.
// cli returns a command of the warmfleet CLI binary bin against f's NATS.
func (f *fleet) cli(bin string) func(args ...string) *exec.Cmd {
	return func(args ...string) *exec.Cmd {
		return exec.Command(bin, append([]string{"--nats-url", f.nats.URL()}, args...)...)
	}
}

// runLogs is `warmfleet run logs <id>`'s stdout and stderr, raw.
func (f *fleet) runLogs(bin, id string) (stdout, stderr bytes.Buffer) {
	cmd := f.cli(bin)("run", "logs", id)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		f.t.Fatalf("warmfleet run logs: %v\n%s", err, stderr.Bytes()[:min(stderr.Len(), 2000)])
	}
	return stdout, stderr
}

func (f *fleet) startAgentProcess(bin string, w world, nodeID, dataDir, name string, extra ...string) *exec.Cmd {
	t := f.t
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--node-id", nodeID, "--nats-url", f.nats.URL(), "--data-dir", dataDir,
		"--containerd-address", w.ctrd.Address, "--containerd-namespace", w.ctrd.Namespace, "--image-dir", w.imageDir,
		"--network-bridge", w.bridge.Name, "--network-subnet", w.bridge.Subnet, "--network-ipam-dir", w.ipamDir, "--log-level", "debug"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("%s:\n%s", name, b[max(0, len(b)-20000):])
		}
	})
	return cmd
}

// TestAcceptance_LogsAfterNodeLoss: a node prints part of a Run and is
// lost; the Run is retried and finishes elsewhere. The lost attempt's
// output stays readable after its node and its files are gone, beside the
// second attempt's.
func TestAcceptance_LogsAfterNodeLoss(t *testing.T) {
	wa, wb := newWorld(t), newWorld(t)
	f := newFleet(t, func(c *controlplane.Config) { c.MaxAttempts = 2 })
	dirA := tempDir(t)
	a := f.startAgent(agentSpec{id: "node-a", world: wa, dataDir: dirA})
	id := f.submit(schemas.RunRequest{RequestID: "logs-lost", Image: wa.image.Reference, Command: []string{"sh", "-c",
		`seq 1 500 | sed "s/^/$WARMFLEET_NODE_ID /"; if [ "$WARMFLEET_NODE_ID" = node-a ]; then sleep 120; fi`}})
	f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
	first := [2]string{schemas.WorkloadID(id, 1), bus.LogStdout}
	f.eventually(30*time.Second, "node-a's lines stored", func() bool { return numbered(f.stored(id).bytes[first], "node-a", 500) == nil })
	f.startAgent(agentSpec{id: "node-b", world: wb})
	a.part.stop(t) // node-a goes silent, then its machine goes away
	if err := os.RemoveAll(dirA); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)

	got := f.stored(id)
	if err := numbered(got.bytes[first], "node-a", 500); err != nil {
		t.Errorf("the lost attempt's output: %v", err)
	}
	second := [2]string{schemas.WorkloadID(id, 2), bus.LogStdout}
	if err := numbered(got.bytes[second], "node-b", 500); err != nil {
		t.Errorf("the second attempt's output: %v", err)
	}
	if _, ok := got.ended[second]; !ok {
		t.Error("the second attempt's stdout was not closed")
	}
	if !got.nodes["node-a"] || !got.nodes["node-b"] {
		t.Errorf("chunks name nodes %v, want both", got.nodes)
	}
}

// TestAcceptance_LogFloodIsolated: one Run writes as fast as it can; what
// exceeds its rate limit is dropped at the node, its markers account for
// every byte dropped, and another Run on the same node starts and ends
// normally with all its lines stored.
func TestAcceptance_LogFloodIsolated(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	const rate, burst = 1 << 20, 1 << 20
	n := f.startAgent(agentSpec{id: "node-a", world: w, logRate: rate, logBurst: burst})
	// 10 MiB of x's (no newline) per round, for at least five seconds and
	// then until the test creates /ctl/stop (at most two minutes): however
	// slowly the quiet Run below starts, the flood outlasts it.
	ctl := []schemas.CacheMount{{Name: "flood-ctl", Path: "/ctl"}}
	flood := f.submit(schemas.RunRequest{RequestID: "flood", Image: w.image.Reference, Caches: ctl, Command: []string{"sh", "-c",
		`start=$(date +%s); k=0; while [ $(date +%s) -lt $((start+5)) ] || { [ ! -e /ctl/stop ] && [ $(date +%s) -lt $((start+120)) ]; }; do head -c 10485760 /dev/zero | tr '\0' x; k=$((k+1)); done; echo "rounds $k" >&2`}})
	f.waitPhase(flood, schemas.PhaseRunning, 60*time.Second)
	quiet := f.submit(schemas.RunRequest{RequestID: "quiet", Image: w.image.Reference, Command: printer(1000, "")})
	q := f.waitPhase(quiet, schemas.PhaseSucceeded, 60*time.Second)
	if fl, _ := f.run(flood); fl.Phase.Terminal() {
		t.Fatalf("the flood ended (%s) before the quiet Run did: no overlap to test", fl.Phase)
	}
	if err := os.WriteFile(n.cacheFile("flood-ctl", "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	qs := f.stored(quiet)
	if err := numbered(qs.bytes[[2]string{q.AttemptID, bus.LogStdout}], "out", 1000); err != nil {
		t.Errorf("the quiet Run's stdout: %v", err)
	}

	fl := f.waitPhase(flood, schemas.PhaseSucceeded, 60*time.Second)
	got := f.stored(flood)
	out := got.bytes[[2]string{fl.AttemptID, bus.LogStdout}]
	var rounds int64
	if _, err := fmt.Sscanf(string(got.bytes[[2]string{fl.AttemptID, bus.LogStderr}]), "rounds %d", &rounds); err != nil || rounds == 0 {
		t.Fatalf("the flood's stderr %q: %v", got.bytes[[2]string{fl.AttemptID, bus.LogStderr}], err)
	}
	kept := int64(bytes.Count(out, []byte("x")))
	var dropped int64
	markers := 0
	for _, line := range strings.Split(string(out), "\n") {
		var d int64
		if _, err := fmt.Sscanf(line, "[warmfleet: %d bytes of stdout dropped", &d); err == nil {
			dropped += d
			markers++
		}
	}
	if markers == 0 {
		t.Fatal("no drop marker in the flood's output")
	}
	if kept+dropped != rounds*10<<20 {
		t.Fatalf("kept %d + dropped %d = %d bytes, the Run wrote %d", kept, dropped, kept+dropped, rounds*10<<20)
	}
	took := fl.FinishedAt.Sub(*fl.StartedAt)
	if limit := burst + int64(took.Seconds()+1)*rate; kept > limit {
		t.Fatalf("kept %d bytes over %s, past the limit's %d", kept, took, limit)
	}
	t.Logf("flood: wrote %d MiB in %s, kept %d bytes, dropped %d in %d markers", rounds*10, took, kept, dropped, markers)
}
