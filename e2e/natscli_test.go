package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// natsCLIInstall is how the stock `nats` CLI is installed; `make test` runs it
// when the CLI is missing.
const natsCLIInstall = "go install github.com/nats-io/natscli/nats@v0.5.0"

// TestAcceptance_NatsCLIExamples runs the README's "Try it" commands with the
// real `nats` CLI against an embedded NATS server, a control plane and one
// agent, as `make run` sets them up: auth and TLS on, the CLI logging in
// through NATS_CONTEXT and an operator login file (bus.OperatorContext, as
// serve writes one). It checks that they do what the README says: a JSON RunRequest
// published with `nats pub` runs to succeeded, `nats sub` shows its events
// accepted … succeeded, `nats kv get` shows the Run record, `nats kv watch`
// shows the node, and `nats stream view` shows the audit log.
// TestNatsCLIExamplesInREADME checks that the README shows these very
// commands. Set WARMFLEET_TRYIT_OUT to a file to get the transcript (as the
// README shows it) written there.
func TestAcceptance_NatsCLIExamples(t *testing.T) {
	bin := findNatsCLI(t)
	w := newWorld(t)
	f := newSecureFleet(t)
	f.runtime = func(dataDir string, log *zap.Logger) noderuntime.Runtime {
		rt, err := containerd.New(context.Background(), w.runtimeOptions(dataDir, log))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Close() })
		return rt
	}
	n := f.startAgent("local-1")
	cli := newNatsCLI(t, bin, f.nats.Server())
	cli.login(f)

	steps, runID := natsCLISteps(w.image.Reference)

	// 1. Follow the events first (a core subscription sees only what is
	// published after it exists), bounded by --count and a deadline.
	subCtx, subCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer subCancel()
	sub := cli.follow(subCtx, steps["sub"], []string{"--count", "60"}, func(line string) bool {
		// The phase event, not the attempt_ended one just before it that
		// carries the same phase.
		return strings.Contains(line, `"run_id":"`+runID+`"`) && strings.Contains(line, `"type":"phase"`) && strings.Contains(line, `"phase":"succeeded"`)
	})
	cli.waitSubscribed(sub, steps["sub"][1], 10*time.Second)
	// The Run's output, live: its one line arrives as a message.
	logSub := cli.follow(subCtx, steps["logsub"], []string{"--count", "1"}, func(line string) bool { return strings.TrimSpace(line) == "hi" })
	cli.waitSubscribed(logSub, steps["logsub"][1], 10*time.Second)

	// 2. Submit.
	out := cli.run(30*time.Second, steps["pub"])
	if !strings.Contains(out, `Published `) || !strings.Contains(out, `"`+steps["pub"][1]+`"`) {
		t.Fatalf("nats pub: unexpected output:\n%s", out)
	}

	// 3. The events, accepted … succeeded, each once in seq order once
	// deduplicated.
	out = sub.wait(t, 90*time.Second)
	evs, dups := parseEvents(t, out, runID)
	var phases []schemas.Phase
	decided := false
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Errorf("nats sub: event %d has seq %d; want a gapless log", i, ev.Seq)
		}
		switch ev.Type {
		case schemas.EventAccepted, schemas.EventPhase:
			phases = append(phases, ev.Phase)
		case schemas.EventDecided:
			decided = decided || (ev.Decision != nil && ev.Decision.Winner == "local-1")
		case schemas.EventRejected:
			t.Errorf("nats sub: the run was rejected: %s %s", ev.Code, ev.Message)
		}
	}
	want := []schemas.Phase{schemas.PhaseAccepted, schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching,
		schemas.PhaseRunning, schemas.PhaseSucceeded}
	if !slices.Equal(phases, want) || !decided {
		t.Fatalf("nats sub: phases %v (decided on local-1: %v), want %v; output:\n%s", phases, decided, want, out)
	}
	t.Logf("nats sub: %d events, %d repeated deliveries of an event already shown", len(evs), dups)
	if out := logSub.wait(t, 30*time.Second); !strings.Contains(out, "Wf-Stream: stdout") {
		t.Fatalf("nats sub %s: no stdout chunk with its headers:\n%s", steps["logsub"][1], out)
	}

	// 4. The Run record.
	out = cli.run(30*time.Second, steps["get"])
	var run schemas.Run
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &run); err != nil {
		t.Fatalf("nats kv get: not a Run record (%v):\n%s", err, out)
	}
	if run.ID != runID || run.Phase != schemas.PhaseSucceeded || run.ExitCode == nil || *run.ExitCode != 0 || run.NodeID != "local-1" {
		t.Fatalf("nats kv get: run %s phase %s exit %v node %q, want %s succeeded exit 0 on local-1", run.ID, run.Phase, run.ExitCode, run.NodeID, runID)
	}

	// 5. The node registry: watched until the node shows, then interrupted.
	watchCtx, watchCancel := context.WithTimeout(context.Background(), time.Minute)
	defer watchCancel()
	nodeLine := "PUT wf_nodes > local-1: "
	watch := cli.follow(watchCtx, steps["watch"], nil, func(line string) bool { return strings.Contains(line, nodeLine) })
	out = watch.wait(t, 20*time.Second)
	var rec schemas.NodeRecord
	for _, line := range strings.Split(out, "\n") {
		if _, js, ok := strings.Cut(line, nodeLine); ok {
			if err := json.Unmarshal([]byte(js), &rec); err != nil {
				t.Fatalf("nats kv watch: the value is not a NodeRecord (%v): %s", err, js)
			}
		}
	}
	if tok := n.agent.Enrollment().FencingToken; rec.FencingToken == 0 || rec.FencingToken != tok {
		t.Fatalf("nats kv watch: fencing token %d, the agent holds %d; output:\n%s", rec.FencingToken, tok, out)
	}

	// 6. The audit log. `nats stream view` pages interactively and refuses
	// to run without a terminal, so it runs under script(1)'s pseudo
	// terminal; one Run's events fit on its first page, so it ends itself.
	if _, err := exec.LookPath("script"); err != nil {
		msg := "script(1) not found (apt-get install -y bsdutils): nats stream view needs a terminal"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log(msg + "; not run")
	} else {
		out = cli.runInTerminal(30*time.Second, steps["view"])
		viewed, dups := parseEvents(t, out, runID)
		if len(viewed) != len(evs) || dups != 0 || !strings.Contains(out, "Reached apparent end of data") {
			t.Fatalf("nats stream view: %d events (%d repeated), want the %d events once; output:\n%s", len(viewed), dups, len(evs), out)
		}
		// 7. The Run's stored output: its line, then each stream's close.
		out = cli.runInTerminal(30*time.Second, steps["logview"])
		if !regexp.MustCompile(`(?m)^hi\r?$`).MatchString(out) || strings.Count(out, bus.HeaderLogEnd+":") != 2 {
			t.Fatalf("nats stream view WF_LOGS: want the line hi and two stream ends; output:\n%s", out)
		}
	}
	cli.saveTranscript()
}

// natsCLIRequestID is the request id of the README's example; the Run id
// derived from it is the one the README shows.
const natsCLIRequestID = "hello-1"

// natsCLISteps returns the README's nats commands (the arguments after
// `nats`) for an image, and the Run id the example's request names.
func natsCLISteps(image string) (map[string][]string, string) {
	runID := schemas.RunIDFor(schemas.DefaultTenant, natsCLIRequestID)
	body := fmt.Sprintf(`{"request_id":%q,"image":%q,"command":["sh","-c","echo hi"]}`, natsCLIRequestID, image)
	return map[string][]string{
		"sub":   {"sub", bus.RunEventsSubject(schemas.DefaultTenant, ">")},
		"pub":   {"pub", bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), body},
		"get":   {"kv", "get", "wf_runs", runID, "--raw"},
		"watch": {"kv", "watch", "wf_nodes"},
		"view":  {"stream", "view", "WF_EVENTS", "--subject", bus.RunEventsSubject(schemas.DefaultTenant, runID)},
		// The Run's output, live and stored.
		"logsub":  {"sub", bus.RunLogsSubject(schemas.DefaultTenant, runID)},
		"logview": {"stream", "view", "WF_LOGS", "--subject", bus.RunLogsSubject(schemas.DefaultTenant, runID)},
	}, runID
}

// TestNatsCLIExamplesInREADME: the README's "Try it" section shows the
// commands TestAcceptance_NatsCLIExamples runs, so the docs cannot drift
// from what is tested. It needs neither the CLI nor containerd.
func TestNatsCLIExamplesInREADME(t *testing.T) {
	steps, _ := natsCLISteps("localhost/busybox@sha256:" + strings.Repeat("0", 64))
	checkREADMEShows(t, steps["sub"], steps["pub"], steps["get"], steps["watch"], steps["view"], steps["logsub"], steps["logview"])
}

// findNatsCLI returns the nats CLI from PATH, or from where `go install`
// puts it; without one it skips (fails under CI) with the install command.
func findNatsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	var dirs []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n") // GOBIN's line is empty when unset
		if len(lines) == 2 {
			if lines[0] != "" {
				dirs = append(dirs, lines[0])
			}
			for _, p := range filepath.SplitList(lines[1]) {
				dirs = append(dirs, filepath.Join(p, "bin"))
			}
		}
	}
	if home, err := os.UserHomeDir(); err == nil && !slices.Contains(dirs, filepath.Join(home, "go", "bin")) {
		dirs = append(dirs, filepath.Join(home, "go", "bin")) // go's default GOPATH
	}
	for _, d := range dirs {
		p := filepath.Join(d, "nats")
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := fmt.Sprintf("the nats CLI is not on PATH nor in %v: %s (or `make test`, which installs it)", dirs, natsCLIInstall)
	if os.Getenv("CI") != "" {
		t.Fatal("CI is set, refusing to skip: " + msg)
	}
	t.Skip(msg)
	return ""
}

// natsCLI runs the nats binary against one server, isolated from the
// user's nats contexts and NATS_* settings, and keeps a transcript.
type natsCLI struct {
	t          *testing.T
	bin, url   string
	srv        *server.Server // asked whether a subscription is in place
	env        []string
	mu         sync.Mutex
	transcript strings.Builder
}

func newNatsCLI(t *testing.T, bin string, srv *server.Server) *natsCLI {
	url := srv.ClientURL()
	home := t.TempDir()
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "NO_COLOR=1", "TERM=dumb"}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || k == "HOME" || k == "XDG_CONFIG_HOME" || k == "NO_COLOR" || k == "TERM" {
			continue
		}
		env = append(env, kv)
	}
	c := &natsCLI{t: t, bin: bin, url: url, srv: srv, env: env}
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err == nil {
		t.Logf("nats CLI %s: %s", bin, strings.TrimSpace(string(out)))
	}
	return c
}

// login makes the CLI log in as the operator of sf over its TLS, through a
// context file in NATS_CONTEXT, as the README's `make run` setup does.
func (c *natsCLI) login(sf *secureFleet) {
	c.t.Helper()
	pki := sf.pki
	ctxFile := filepath.Join(c.t.TempDir(), bus.OperatorContextFile)
	if err := bus.WriteOperatorContext(ctxFile, bus.OperatorContext{URL: sf.url, User: bus.OperatorUser, Password: sf.secrets["operator token"],
		CA: pki.CAFile, Cert: pki.ClientCert, Key: pki.ClientKey}); err != nil {
		c.t.Fatal(err)
	}
	c.env = append(c.env, "NATS_CONTEXT="+ctxFile)
}

// record adds a command and its output to the transcript, the way the
// README shows them (without -s and the test's bounding flags).
func (c *natsCLI) record(args []string, out string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(&c.transcript, "$ nats %s\n%s\n", shellJoin(args), strings.TrimRight(out, "\n"))
	c.t.Logf("$ nats -s %s %s\n%s", c.url, shellJoin(args), out)
}

func (c *natsCLI) saveTranscript() {
	if p := os.Getenv("WARMFLEET_TRYIT_OUT"); p != "" {
		c.mu.Lock()
		defer c.mu.Unlock()
		if err := os.WriteFile(p, []byte(c.transcript.String()), 0o644); err != nil {
			c.t.Errorf("write transcript: %v", err)
		}
	}
}

func (c *natsCLI) argv(args, extra []string) []string {
	return append(append([]string{"-s", c.url}, args...), extra...)
}

func (c *natsCLI) command(ctx context.Context, argv []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.bin, argv...)
	cmd.Env = c.env
	cmd.Stdin = nil // /dev/null
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs one command to completion within the deadline and fails t unless
// it exits 0. It returns stdout and stderr together.
func (c *natsCLI) run(within time.Duration, args []string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	out, err := c.command(ctx, c.argv(args, nil)).CombinedOutput()
	c.record(args, string(out))
	if err != nil {
		c.t.Fatalf("nats %s: %v after %s (deadline %s):\n%s", shellJoin(args), err, time.Since(start).Round(time.Millisecond), within, out)
	}
	return string(out)
}

// runInTerminal runs one command under script(1), which gives it a pseudo
// terminal, for commands that refuse to run without one.
func (c *natsCLI) runInTerminal(within time.Duration, args []string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	line := shellJoin(append([]string{c.bin}, c.argv(args, nil)...))
	cmd := exec.CommandContext(ctx, "script", "-q", "-e", "-c", line, "/dev/null")
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	raw, err := cmd.CombinedOutput()
	out := strings.ReplaceAll(string(raw), "\r\n", "\n")
	c.record(args, out)
	if err != nil {
		c.t.Fatalf("nats %s (under script): %v:\n%s", shellJoin(args), err, out)
	}
	return out
}

// follower is a long-running command whose output is read line by line.
type follower struct {
	cmd     *exec.Cmd
	args    []string
	c       *natsCLI
	mu      sync.Mutex
	out     strings.Builder
	matched chan struct{} // closed when a line satisfied the predicate
	exited  chan struct{} // closed when the command exited
	err     error         // the command's exit; read after exited
}

// follow starts a command that runs until stopped (or until its own bound,
// extra), and watches its output for a line until which says so.
func (c *natsCLI) follow(ctx context.Context, args, extra []string, until func(line string) bool) *follower {
	c.t.Helper()
	cmd := c.command(ctx, c.argv(args, extra))
	pr, pw, err := os.Pipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	// Stop it as an operator would, with ^C; the context's end kills it
	// only if that does not work within WaitDelay.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start nats %s: %v", shellJoin(args), err)
	}
	_ = pw.Close()
	fl := &follower{cmd: cmd, args: args, c: c, matched: make(chan struct{}), exited: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer pr.Close()
		var once sync.Once
		buf := make([]byte, 64<<10)
		var partial string
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				fl.mu.Lock()
				fl.out.Write(buf[:n])
				fl.mu.Unlock()
				lines := strings.Split(partial+string(buf[:n]), "\n")
				partial = lines[len(lines)-1]
				for _, l := range lines[:len(lines)-1] {
					if until(l) {
						once.Do(func() { close(fl.matched) })
					}
				}
			}
			if err != nil {
				if partial != "" && until(partial) {
					once.Do(func() { close(fl.matched) })
				}
				return
			}
		}
	}()
	go func() {
		fl.err = cmd.Wait()
		<-read
		close(fl.exited)
	}()
	c.t.Cleanup(func() { fl.stop() })
	return fl
}

func (fl *follower) output() string {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.out.String()
}

// stop interrupts the command (if it still runs) and waits for it.
func (fl *follower) stop() {
	select {
	case <-fl.exited:
		return
	default:
	}
	_ = fl.cmd.Process.Signal(os.Interrupt)
	select {
	case <-fl.exited:
	case <-time.After(5 * time.Second):
		_ = fl.cmd.Process.Kill()
		<-fl.exited
	}
}

// wait waits until a line matched, then stops the command and returns its
// output; it fails t when the command exits or the time runs out first.
func (fl *follower) wait(t *testing.T, within time.Duration) string {
	t.Helper()
	select {
	case <-fl.matched:
	case <-fl.exited:
		select {
		case <-fl.matched:
		default:
			fl.c.record(fl.args, fl.output())
			t.Fatalf("nats %s exited (%v) before showing what the test waits for:\n%s", shellJoin(fl.args), fl.err, fl.output())
		}
	case <-time.After(within):
		fl.stop()
		fl.c.record(fl.args, fl.output())
		t.Fatalf("nats %s: not shown within %s:\n%s", shellJoin(fl.args), within, fl.output())
	}
	fl.stop()
	out := fl.output()
	fl.c.record(fl.args, out)
	return out
}

// waitSubscribed waits until the server holds the CLI's subscription on
// subject: the CLI logs "Subscribing on" before it subscribes.
func (c *natsCLI) waitSubscribed(fl *follower, subject string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if cz, err := c.srv.Connz(&server.ConnzOptions{Subscriptions: true}); err == nil {
			for _, ci := range cz.Conns {
				if strings.HasPrefix(ci.Name, "NATS CLI") && slices.Contains(ci.Subs, subject) {
					return
				}
			}
		}
		select {
		case <-fl.exited:
			c.t.Fatalf("nats %s exited (%v):\n%s", shellJoin(fl.args), fl.err, fl.output())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nats %s: no subscription on %s at the server after %s:\n%s", shellJoin(fl.args), subject, within, fl.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// parseEvents reads the JSON RunEvents of runID out of CLI output (one JSON
// document per line), drops repeats of a seq already seen, and returns them
// in seq order with the number of repeats.
func parseEvents(t *testing.T, out, runID string) ([]schemas.RunEvent, int) {
	t.Helper()
	bySeq := map[uint64]schemas.RunEvent{}
	dups := 0
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var ev schemas.RunEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not a RunEvent (%v): %s", err, line)
		}
		if ev.RunID != runID {
			continue
		}
		if _, seen := bySeq[ev.Seq]; seen {
			dups++
			continue
		}
		bySeq[ev.Seq] = ev
	}
	evs := make([]schemas.RunEvent, 0, len(bySeq))
	for _, ev := range bySeq {
		evs = append(evs, ev)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	return evs, dups
}

// shellJoin quotes args for a POSIX shell, the way the README writes them.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@,+", r))
		}) {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

var digestRE = regexp.MustCompile(`sha256:[0-9a-f]{64}`)

// checkREADMEShows fails t unless the README's "Try it" section shows each
// command as `nats <args>`. Image digests may differ (they depend on the
// host's busybox), everything else must match.
func checkREADMEShows(t *testing.T, cmds ...[]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Try it\n")
	if !ok {
		t.Fatal(`README.md has no "## Try it" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	section = digestRE.ReplaceAllString(section, "sha256:<digest>")
	for _, args := range cmds {
		line := "nats " + digestRE.ReplaceAllString(shellJoin(args), "sha256:<digest>")
		if !strings.Contains(section, line) {
			t.Errorf("README's Try it section does not show `%s`, which this test runs", line)
		}
	}
}
