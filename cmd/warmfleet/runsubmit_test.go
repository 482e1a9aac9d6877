package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

const testImage = "localhost/busybox@sha256:293b61c04e6cc91c9c17343b579b3be84b0cfe4881ad4f9018ab3a023e69e263"

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestRunSubmitArtifactFlags(t *testing.T) {
	f := submitFlags{image: testImage, artifacts: []string{"llama-8b=/models/llama", "llama-8b:v1=/models/v1", "data@" + testDigest + "=/data/x=y"}}
	req, err := f.request([]string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	want := []schemas.ArtifactUse{{Name: "llama-8b", Path: "/models/llama"}, {Name: "llama-8b", Version: "v1", Path: "/models/v1"},
		{Name: "data", Digest: testDigest, Path: "/data/x=y"}}
	if !reflect.DeepEqual(req.Artifacts, want) {
		t.Fatalf("artifacts %+v, want %+v", req.Artifacts, want)
	}

	for _, tc := range []struct {
		args []string
		want string // in the refusal, after `--artifact "<arg>": `
	}{
		{[]string{"llama-8b"}, "give NAME[:VERSION|@sha256:<hex>]=PATH"},
		{[]string{"llama-8b="}, "give NAME[:VERSION|@sha256:<hex>]=PATH"},
		{[]string{"=/models"}, "give NAME[:VERSION|@sha256:<hex>]=PATH"},
		{[]string{"Llama=/models"}, "the name must be lowercase"},
		{[]string{"llama:v1@" + testDigest + "=/models"}, "not both"},
		{[]string{"llama@sha256:abc=/models"}, "sha256:<64 lowercase hex digits>"},
		{[]string{"llama=models"}, "an absolute path inside the container"},
		{[]string{"llama=/a", "other=/a"}, "another cache or artifact is mounted at this path"},
	} {
		f := submitFlags{image: testImage, artifacts: tc.args}
		_, err := f.request(nil)
		bad := tc.args[len(tc.args)-1]
		if err == nil || !strings.HasPrefix(err.Error(), `--artifact "`) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--artifact %q: %v, want a refusal naming the flag, %q and %q", tc.args, err, bad, tc.want)
		}
	}

	f = submitFlags{file: "req.json", artifacts: []string{"llama=/m"}}
	if _, err := f.request(nil); err == nil || !strings.Contains(err.Error(), "--artifact and -f exclude each other") {
		t.Errorf("--artifact with -f: %v", err)
	}
}

// A refusal before anything is sent exits 125, as docker run's, naming
// the flag; so does a flag cobra cannot parse.
func TestRunSubmitRefusalsExit125(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", testImage, "--artifact", "nope", "--", "true"}, `warmfleet: --artifact "nope": give NAME`},
		{[]string{"--image", testImage, "--quiet", "--", "true"}, "warmfleet: --quiet chooses what --wait shows"},
		{[]string{"--no-such-flag"}, "--no-such-flag"},
		{[]string{"--gpus", "many"}, `"--gpus"`},
	} {
		var stdout, stderr syncBuffer
		err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, append([]string{"run", "submit"}, tc.args...)...)
		var msg bytes.Buffer
		if code := exitCode(&msg, err); code != exitNoRunCode || !strings.Contains(msg.String(), tc.want) {
			t.Errorf("run submit %s: exit %d, %q; want 125 and %q", strings.Join(tc.args, " "), code, msg.String(), tc.want)
		}
	}
}

// runPlay plays a control plane and a node for one Run on b: its events
// and output, as they would arrive.
type runPlay struct {
	b     logBus
	runID string
	seq   uint64
}

func (p *runPlay) event(ev schemas.RunEvent) {
	p.b.t.Helper()
	p.seq++
	ev.RunID, ev.Seq, ev.At = p.runID, p.seq, time.Now()
	body, _ := json.Marshal(ev)
	if _, err := p.b.js.Publish(context.Background(), bus.RunEventsSubject(schemas.DefaultTenant, p.runID), body); err != nil {
		p.b.t.Fatal(err)
	}
}

func (p *runPlay) phase(phase schemas.Phase, code schemas.Code, msg string, exit *int) {
	p.event(schemas.RunEvent{Type: schemas.EventPhase, Phase: phase, NodeID: "n1", Attempt: 1, Code: code, Message: msg, ExitCode: exit})
}

// submitWait runs `run submit --wait` with args in the background; the
// returned function waits for it and returns its exit status and stderr
// note.
func submitWait(t *testing.T, b logBus, stdout, stderr *syncBuffer, args ...string) func() (int, string) {
	res := make(chan error, 1)
	go func() {
		res <- cliOut(b.url, stdout, stderr, append([]string{"run", "submit", "--image", testImage, "--wait"}, args...)...)
	}()
	return func() (int, string) {
		t.Helper()
		select {
		case err := <-res:
			var msg bytes.Buffer
			if err == nil {
				return 0, ""
			}
			return exitCode(&msg, err), msg.String()
		case <-time.After(30 * time.Second):
			t.Fatal("run submit --wait did not end with the Run")
			return 0, ""
		}
	}
}

func waitForText(t *testing.T, w *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(w.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", want, w.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// `run submit --wait` prints the Run's stdout to stdout and its stderr to
// stderr as they arrive, its own progress to stderr, and exits with the
// Run's exit code.
func TestRunSubmitWaitShowsOutput(t *testing.T) { asEachReader(t, testRunSubmitWaitShowsOutput) }

func testRunSubmitWaitShowsOutput(t *testing.T) {
	b := newLogBus(t)
	p := &runPlay{b: b, runID: schemas.RunIDFor(schemas.DefaultTenant, "wait-1")}
	p.event(schemas.RunEvent{Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted})
	p.phase(schemas.PhasePlaced, "", "booked on n1", nil)
	p.phase(schemas.PhasePreparing, "", "node is preparing the image and artifact weights", nil)
	p.event(schemas.RunEvent{Type: schemas.EventProgress, Phase: schemas.PhasePreparing, Message: "artifact weights transfer 1.0 MiB of 4.0 MiB (25%)"})
	p.phase(schemas.PhaseRunning, "", "container running", nil)
	now := time.Now()
	b.chunk(p.runID, 1, bus.LogStdout, 0, now, "hello\n")

	var stdout, stderr syncBuffer
	wait := submitWait(t, b, &stdout, &stderr, "--request-id", "wait-1", "--", "sh", "-c", "…")
	waitForText(t, &stdout, "hello\n") // live, before the Run ends
	// Events and logs arrive on consumers of their own: the stderr chunk
	// goes once the events before it are printed, so the order below is
	// the one they were published in.
	waitForText(t, &stderr, "warmfleet: running: container running\n")
	b.chunk(p.runID, 1, bus.LogStderr, 0, now, "oops\n")
	waitForText(t, &stderr, "oops\n")
	b.chunk(p.runID, 1, bus.LogStdout, 6, now, "bye\nno newline")
	b.chunk(p.runID, 1, bus.LogStderr, 5, now, "last words")
	p.phase(schemas.PhaseFailed, schemas.CodeExitNonZero, "exited non-zero", new(3))

	code, note := wait()
	if code != 3 || note != "" {
		t.Fatalf("exit %d with %q, want the Run's exit code 3 and nothing more", code, note)
	}
	if got, want := stdout.String(), "hello\nbye\nno newline"; got != want {
		t.Fatalf("stdout %q, want only the Run's %q", got, want)
	}
	want := "warmfleet: submitted wait-1 as run " + p.runID + "\n" +
		"warmfleet: placed: booked on n1\n" +
		"warmfleet: preparing: node is preparing the image and artifact weights\n" +
		"warmfleet: preparing: artifact weights transfer 1.0 MiB of 4.0 MiB (25%)\n" +
		"warmfleet: running: container running\n" +
		"oops\n" +
		"last words\n" + // the Run wrote no newline: warmfleet's line starts its own
		"warmfleet: failed (exit_nonzero): exited non-zero (exit 3)\n"
	if got := stderr.String(); got != want {
		t.Fatalf("stderr\n%s\nwant\n%s", got, want)
	}
}

// --quiet keeps the events-only view and the same exit status.
func TestRunSubmitWaitQuiet(t *testing.T) { asEachReader(t, testRunSubmitWaitQuiet) }

func testRunSubmitWaitQuiet(t *testing.T) {
	b := newLogBus(t)
	p := &runPlay{b: b, runID: schemas.RunIDFor(schemas.DefaultTenant, "quiet-1")}
	p.phase(schemas.PhaseRunning, "", "container running", nil)
	b.chunk(p.runID, 1, bus.LogStdout, 0, time.Now(), "not shown\n")
	p.phase(schemas.PhaseFailed, schemas.CodeExitNonZero, "exited non-zero", new(3))

	var stdout, stderr syncBuffer
	code, note := submitWait(t, b, &stdout, &stderr, "--quiet", "--request-id", "quiet-1", "--", "true")()
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if code != 3 || note != "" || stderr.String() != "" || len(lines) != 3 || lines[0] != "submitted quiet-1 as run "+p.runID ||
		!strings.Contains(lines[1], "container running") || !strings.Contains(lines[2], "exited non-zero (exit 3)") || strings.Contains(stdout.String(), "not shown") {
		t.Fatalf("exit %d %q\nstdout:\n%s\nstderr:\n%s", code, note, stdout.String(), stderr.String())
	}
}

// A Run that ends without an exit code of its own, or a refused submit,
// exits 125 saying why.
func TestRunSubmitWaitWithoutExitCode(t *testing.T) {
	asEachReader(t, testRunSubmitWaitWithoutExitCode)
}

func testRunSubmitWaitWithoutExitCode(t *testing.T) {
	b := newLogBus(t)
	for _, tc := range []struct {
		id   string
		end  schemas.RunEvent
		want string
	}{
		{"lost-1", schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseLost, Code: schemas.CodeNodeLost, Message: "node n1 stopped answering"},
			"ended lost (node_lost) without an exit code of its own: node n1 stopped answering"},
		{"rejected-1", schemas.RunEvent{Type: schemas.EventRejected, Code: schemas.CodeArtifactUnknown, Field: "artifacts[0]", Message: "no artifact weights"},
			"rejected (artifact_unknown): artifacts[0]: no artifact weights"},
		{"zero-1", schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseFailed, Code: schemas.CodeMaxRuntime, Message: "stopped after max_runtime_seconds", ExitCode: new(0)},
			"ended failed (max_runtime_exceeded) without an exit code of its own"},
	} {
		p := &runPlay{b: b, runID: schemas.RunIDFor(schemas.DefaultTenant, tc.id)}
		p.event(tc.end)
		var stdout, stderr syncBuffer
		code, note := submitWait(t, b, &stdout, &stderr, "--request-id", tc.id, "--", "true")()
		if code != exitNoRunCode || !strings.Contains(note, "run "+p.runID+" "+tc.want) || stdout.String() != "" {
			t.Errorf("%s: exit %d, %q, stdout %q; want 125 and %q", tc.id, code, note, stdout.String(), tc.want)
		}
	}
}

func TestRunOutcome(t *testing.T) {
	for _, tc := range []struct {
		end  schemas.RunEvent
		code int
	}{
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseSucceeded, ExitCode: new(0)}, 0},
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseFailed, ExitCode: new(3)}, 3},
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseCancelled, ExitCode: new(143)}, 143},
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseCancelled}, exitNoRunCode},
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseFailed, ExitCode: new(300)}, exitNoRunCode},
		{schemas.RunEvent{Type: schemas.EventPhase, Phase: schemas.PhaseFailed, ExitCode: new(-1)}, exitNoRunCode},
		{schemas.RunEvent{Type: schemas.EventRejected}, exitNoRunCode},
	} {
		err := runOutcome("r-1", tc.end)
		var st *exitStatus
		switch {
		case tc.code == 0 && err != nil, tc.code != 0 && (!errors.As(err, &st) || st.code != tc.code):
			t.Errorf("%+v: %v, want exit %d", tc.end, err, tc.code)
		case tc.code == exitNoRunCode && st.err == nil:
			t.Errorf("%+v: exit 125 without saying why", tc.end)
		}
	}
}
