package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_SecureDefaults runs the real binaries as an operator
// would. `serve --listen 0.0.0.0` without --auth exits non-zero naming the
// flag, and with --insecure-no-auth starts and warns. `make run`'s setup
// (serve --auth, embedded, as scripts/run-local.sh starts it) refuses a
// client without a login and one over plain TCP, admits the `warmfleet` CLI
// with no environment (it finds serve's operator login) and the stock
// `nats` CLI through NATS_CONTEXT, and admits an agent whose only trust is
// the bootstrap's CA, which then runs a Run; an agent logging in without
// TLS is refused.
func TestAcceptance_SecureDefaults(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "scripts", "run-local.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bin/warmfleet serve --auth ", "bin/warmfleet-agent --nats-auth "} {
		if !strings.Contains(string(script), want) {
			t.Fatalf("scripts/run-local.sh no longer runs %q; this test starts what it starts", want)
		}
	}
	wf := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")
	agentBin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet-agent")

	// Open beyond loopback without --auth: refused before anything starts.
	refused := startProc(t, t.TempDir(), wf, "serve", "--listen", "0.0.0.0", "--port", "-1", "--data-dir", t.TempDir())
	if err := refused.wait(30 * time.Second); err == nil {
		t.Fatal("serve --listen 0.0.0.0 without --auth exited 0")
	}
	if out := refused.output(); !strings.Contains(out, string(schemas.CodeAuthRequired)) || !strings.Contains(out, "--auth") || !strings.Contains(out, "--insecure-no-auth") {
		t.Fatalf("serve --listen 0.0.0.0 without --auth: want %s naming --auth and --insecure-no-auth:\n%s", schemas.CodeAuthRequired, out)
	}
	// With the override it starts, and says what it is doing.
	open := startProc(t, t.TempDir(), wf, "serve", "--listen", "0.0.0.0", "--port", "-1", "--data-dir", t.TempDir(), "--insecure-no-auth")
	open.waitFor(t, 60*time.Second, regexp.MustCompile(`control plane serving on`))
	if out := open.output(); !strings.Contains(out, `"level":"warn"`) || !strings.Contains(out, "WITHOUT auth (--insecure-no-auth)") {
		t.Fatalf("serve --insecure-no-auth logged no warning:\n%s", out)
	}
	open.stop()

	// make run: serve --auth on loopback, data in ./.warmfleet.
	work := t.TempDir()
	dataDir := filepath.Join(work, ".warmfleet")
	srv := startProc(t, work, wf, "serve", "--auth", "--data-dir", dataDir, "--port", "-1")
	url := srv.waitFor(t, 60*time.Second, regexp.MustCompile(`control plane serving on (\S+)`))[1]
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("serve --auth serves %s; want TLS", url)
	}
	loginFile := filepath.Join(dataDir, bus.OperatorContextFile)
	for _, f := range []string{loginFile, filepath.Join(dataDir, "tls", "ca-key.pem"), filepath.Join(dataDir, "tls", "server-key.pem")} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v (%v); want a 0600 file", f, st, err)
		}
	}
	login, err := bus.ReadOperatorContext(loginFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(srv.output(), login.Password) {
		t.Fatal("serve printed the operator token")
	}
	caTLS, err := bus.TLSFiles{CAFile: login.CA}.ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	// No login, over TLS: refused.
	if nc, err := nats.Connect(url, append(caTLS, nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("a client without a login was admitted")
	} else if !bus.IsAuthError(err) {
		t.Fatalf("a client without a login: %v; want an authorization refusal", err)
	}
	// The operator's own login over plain TCP: refused, the server takes TLS only.
	plain := "nats://" + strings.TrimPrefix(url, "tls://")
	if nc, err := nats.Connect(plain, append(bus.OperatorCredentials(login.Password).Options(), nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("a client over plain TCP was admitted")
	}

	// The warmfleet CLI, no environment, no --nats-url: it finds serve's login.
	cliEnv := func(dir string, env []string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, wf, args...)
		cmd.Dir, cmd.Env = dir, append(cleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	cli := func(dir string, args ...string) (string, error) { return cliEnv(dir, nil, args...) }
	if out, err := cli(work, "node", "list"); err != nil {
		t.Fatalf("warmfleet node list in make run's directory: %v\n%s", err, out)
	}
	if _, err := os.Stat("/var/lib/warmfleet/" + bus.OperatorContextFile); os.IsNotExist(err) {
		// Elsewhere, with no login found: refused, saying what to set.
		if out, err := cli(t.TempDir(), "--nats-url", url, "node", "list"); err == nil || !strings.Contains(out, bus.EnvNATSCAFile) {
			t.Fatalf("warmfleet with no login and no CA: %v; want a refusal naming %s:\n%s", err, bus.EnvNATSCAFile, out)
		}
		out, err := cliEnv(t.TempDir(), []string{bus.EnvNATSCAFile + "=" + login.CA}, "--nats-url", url, "node", "list")
		if err == nil || !strings.Contains(out, "refused this login") || !strings.Contains(out, bus.EnvNATSTokenFile) {
			t.Fatalf("warmfleet with the CA but no login: %v; want a refusal naming %s:\n%s", err, bus.EnvNATSTokenFile, out)
		}
	}

	// An agent whose only trust is the bootstrap's CA, over TLS with its login.
	boot := filepath.Join(work, "local-1.bootstrap.json")
	if out, err := cli(work, "node", "invite", "--node", "local-1", "--out", boot); err != nil {
		t.Fatalf("node invite: %v\n%s", err, out)
	}
	var b schemas.NodeBootstrap
	if raw, err := os.ReadFile(boot); err != nil || json.Unmarshal(raw, &b) != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if ca, _ := os.ReadFile(login.CA); b.ControlPlaneCA != string(ca) || !strings.HasPrefix(b.ControlPlaneURL, "tls://") {
		t.Fatalf("bootstrap: url %s, carries the CA: %v; want tls:// and the server's CA", b.ControlPlaneURL, b.ControlPlaneCA == string(ca))
	}
	w := newWorld(t)
	agentArgs := []string{"--data-dir", tempDir(t), "--containerd-address", w.ctrd.Address, "--containerd-namespace", w.ctrd.Namespace,
		"--image-dir", w.imageDir, "--network-bridge", w.bridge.Name, "--network-subnet", w.bridge.Subnet, "--network-ipam-dir", w.ipamDir}
	// Logging in without TLS is refused before the agent dials.
	noTLS := startProc(t, work, agentBin, append([]string{"--nats-auth", "--node-id", "plain-1", "--nats-url", plain}, agentArgs...)...)
	if err := noTLS.wait(30 * time.Second); err == nil || !strings.Contains(noTLS.output(), string(schemas.CodeTLSRequired)) ||
		!strings.Contains(noTLS.output(), "--insecure-auth-without-tls") {
		t.Fatalf("agent --nats-auth over %s: %v; want %s naming --insecure-auth-without-tls:\n%s", plain, err, schemas.CodeTLSRequired, noTLS.output())
	}
	agent := startProc(t, work, agentBin, append([]string{"--nats-auth", "--bootstrap", boot}, agentArgs...)...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := cli(work, "node", "list")
		if strings.Contains(out, "local-1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local-1 never enrolled; node list:\n%s\nagent:\n%s", out, agent.output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := cli(work, "run", "submit", "--image", w.image.Reference, "--wait", "--", "sh", "-c", "echo hello over tls")
	if err != nil || !strings.Contains(out, "hello over tls") {
		t.Fatalf("run submit --wait through the CA-only agent: %v\n%s\nagent:\n%s", err, out, agent.output())
	}

	// The stock nats CLI with the context file serve wrote, as the README
	// says: its pub and kv get examples, with no other flag.
	t.Run("nats CLI", func(t *testing.T) {
		natsBin := findNatsCLI(t)
		home := t.TempDir()
		natsCmd := func(args []string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, natsBin, args...)
			cmd.Dir = work
			cmd.Env = append(cleanEnv(), "HOME="+home, "NATS_CONTEXT="+loginFile)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		steps, runID := natsCLISteps(w.image.Reference)
		if out, err := natsCmd(steps["pub"]); err != nil || !strings.Contains(out, "Published") {
			t.Fatalf("NATS_CONTEXT=%s nats %s: %v\n%s", loginFile, shellJoin(steps["pub"]), err, out)
		}
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, err := natsCmd(steps["get"])
			var run schemas.Run
			if err == nil && json.Unmarshal([]byte(out), &run) == nil && run.ID == runID && run.Phase == schemas.PhaseSucceeded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("nats %s: no succeeded Run after 90s: %v\n%s", shellJoin(steps["get"]), err, out)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}

// cleanEnv is this process's environment without any WARMFLEET_ or NATS_
// setting, as a fresh operator shell has it.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARMFLEET_") && !strings.HasPrefix(kv, "NATS_") {
			env = append(env, kv)
		}
	}
	return env
}

// proc is a binary run by a test, its output (stdout and stderr) kept.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    strings.Builder
	exited chan struct{}
	err    error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startProc starts bin in dir with a clean environment; the test's end
// stops it (SIGTERM, then SIGKILL).
func startProc(t *testing.T, dir, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Dir, p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = dir, cleanEnv(), p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), p.output())
		}
	})
	return p
}

// wait waits for the process to exit and returns how it exited.
func (p *proc) wait(within time.Duration) error {
	select {
	case <-p.exited:
		return p.err
	case <-time.After(within):
		p.stop()
		return context.DeadlineExceeded
	}
}

// waitFor waits until the output matches re and returns the match; it
// fails t if the process exits first or the time runs out.
func (p *proc) waitFor(t *testing.T, within time.Duration, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m := re.FindStringSubmatch(p.output()); m != nil {
			return m
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited (%v) before printing %s:\n%s", p.cmd.Path, p.err, re, p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %s:\n%s", p.cmd.Path, re, within, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the process if it still runs: SIGTERM, then SIGKILL.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
