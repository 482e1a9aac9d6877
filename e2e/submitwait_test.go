package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// warmfleetCLI runs the real `warmfleet` binary against a fleet.
type warmfleetCLI struct {
	t   *testing.T
	bin string
	url string
	env []string // added to the test's environment; nil: the test's
}

func newWarmfleetCLI(t *testing.T, f *fleet) warmfleetCLI {
	return warmfleetCLI{t: t, bin: testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet"), url: f.nats.URL()}
}

// run runs one command line to its end and returns its stdout, its stderr
// and its exit status.
func (c warmfleetCLI) run(within time.Duration, args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append([]string{"--nats-url", c.url}, args...)...)
	if c.env != nil {
		cmd.Env = append(os.Environ(), c.env...)
	}
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		c.t.Fatalf("warmfleet %s: not done in %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), within, out.String(), errs.String())
	case errors.As(err, &exit):
		return out.String(), errs.String(), exit.ExitCode()
	case err != nil:
		c.t.Fatalf("warmfleet %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errs.String(), 0
}

// runOutput drops warmfleet's own progress lines from stderr, leaving
// what the Run wrote there.
func runOutput(stderr string) string {
	var b strings.Builder
	for l := range strings.Lines(stderr) {
		if !strings.HasPrefix(l, "warmfleet: ") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// TestAcceptance_SubmitWaitShowsOutput: the real CLI submits a Run that
// writes to both streams and exits 3. `run submit --wait` prints the Run's
// stdout to stdout and its stderr to stderr, its own progress to stderr,
// and exits 3, as docker run does; with --quiet it shows the events
// instead of the output, and exits 3 too.
func TestAcceptance_SubmitWaitShowsOutput(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-a", world: w})
	cli := newWarmfleetCLI(t, f)
	script := "echo out 1; echo err 1 >&2; sleep 1; echo out 2; echo err 2 >&2; exit 3"

	stdout, stderr, code := cli.run(2*time.Minute, "run", "submit", "--image", w.image.Reference, "--request-id", "wait-output", "--wait", "--", "sh", "-c", script)
	runID := schemas.RunIDFor(schemas.DefaultTenant, "wait-output")
	if code != 3 || stdout != "out 1\nout 2\n" || runOutput(stderr) != "err 1\nerr 2\n" {
		t.Fatalf("exit %d, want 3\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"warmfleet: submitted wait-output as run " + runID + "\n", "warmfleet: running: container running\n",
		"warmfleet: failed (exit_nonzero): exited non-zero (exit 3)\n"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr has no %q:\n%s", want, stderr)
		}
	}
	if !strings.HasSuffix(stderr, "warmfleet: failed (exit_nonzero): exited non-zero (exit 3)\n") {
		t.Errorf("stderr does not end with how the Run ended:\n%s", stderr)
	}

	stdout, stderr, code = cli.run(2*time.Minute, "run", "submit", "--image", w.image.Reference, "--request-id", "wait-quiet", "--wait", "--quiet", "--", "sh", "-c", script)
	if code != 3 || stderr != "" || strings.Contains(stdout, "out 1") || !strings.HasPrefix(stdout, "submitted wait-quiet as run ") ||
		!strings.Contains(stdout, "exited non-zero (exit 3)") {
		t.Fatalf("--quiet: exit %d, want 3 and the events alone\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestAcceptance_SubmitArtifactFlag: `run submit --artifact NAME:VERSION=PATH`
// mounts the catalog artifact read-only at PATH, and the fetch's progress
// names the artifact, not an image.
func TestAcceptance_SubmitArtifactFlag(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	rec := f.putArtifact("weights", "v1", artifactBytes(32<<20, 7))
	f.startAgent(agentSpec{id: "node-a", world: w, progressInterval: 5 * time.Millisecond})
	cli := newWarmfleetCLI(t, f)

	stdout, stderr, code := cli.run(2*time.Minute, "run", "submit", "--image", w.image.Reference, "--request-id", "flag-artifact",
		"--artifact", "weights:v1=/data/weights", "--wait", "--", "sh", "-c", "sha256sum /data/weights; if echo x >> /data/weights; then echo WRITABLE; fi")
	if code != 0 || !strings.Contains(stdout, strings.TrimPrefix(rec.Digest, "sha256:")+"  /data/weights") || strings.Contains(stdout, "WRITABLE") {
		t.Fatalf("exit %d, want 0 and the artifact's sha256, read-only\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "warmfleet: preparing: node is preparing the image and artifact weights\n") {
		t.Errorf("no preparing line naming the artifact:\n%s", stderr)
	}
	sawArtifact := false
	for _, ev := range f.events(schemas.RunIDFor(schemas.DefaultTenant, "flag-artifact")) {
		if ev.Type != schemas.EventProgress || ev.Progress == nil || ev.Progress.Artifact == "" {
			continue
		}
		sawArtifact = true
		if ev.Progress.Artifact != "weights" || !strings.HasPrefix(ev.Message, "artifact weights transfer ") {
			t.Errorf("artifact progress event %q (%+v)", ev.Message, *ev.Progress)
		}
	}
	if !sawArtifact {
		t.Error("no progress event for the artifact's fetch")
	}
}
