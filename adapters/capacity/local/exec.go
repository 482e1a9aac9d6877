package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/internal/ctrdproc"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrContainerdAddressGiven is a per-machine containerd configuration whose
// extra agent flags also name a containerd socket: the agent would talk to
// that daemon, not its own.
var ErrContainerdAddressGiven = errors.New("local: per-machine containerd, but the extra agent flags name a --containerd-address")

// ExecConfig describes the agent processes ExecLauncher starts.
type ExecConfig struct {
	// AgentPath is the warmfleet-agent binary.
	AgentPath string
	// Dir holds one directory per machine: its bootstrap (0600), the
	// agent's data dir and its log, and with ContainerdPerMachine its
	// containerd's directory. A machine's directory outlives a stop and is
	// removed when the machine is terminated.
	Dir string
	// Args are extra agent flags every machine gets (image dir,
	// --nats-auth, and without ContainerdPerMachine the shared daemon's
	// --containerd-address). Each machine also gets its own containerd
	// namespace, wf-<name>, so machines do not see each other's images and
	// containers even on a shared daemon.
	Args []string
	// ContainerdPerMachine gives each machine its own containerd daemon
	// (internal/ctrdproc): root, state dir, config, log and socket under
	// <Dir>/<name>/containerd, and the agent pointed at that socket. A stop
	// ends the agent, then the daemon with its tasks and shims, and keeps
	// the directory, so the images a machine pulled are still there when it
	// starts again; a terminate removes it. It needs root, containerd, runc
	// and containerd-shim-runc-v2 (ctrdproc.Check), and Args must not name a
	// --containerd-address. Without it every agent uses the daemon Args
	// name (or the agent's default), in its own namespace.
	ContainerdPerMachine bool
	// ContainerdBinary is the containerd program (default: containerd on
	// PATH).
	ContainerdBinary string
	// StopGrace is how long an agent gets after SIGTERM before SIGKILL.
	StopGrace time.Duration
	Log       *zap.Logger
}

// ExecLauncher launches machines as warmfleet-agent processes on this host.
// The bootstrap is written to the machine's directory verbatim, as JSON, and
// the agent reads it with --bootstrap. Its machines are Suspendable.
func ExecLauncher(cfg ExecConfig) Launcher {
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return func(ctx context.Context, name string, boot schemas.NodeBootstrap) (Machine, error) {
		if cfg.ContainerdPerMachine && NamesContainerdAddress(cfg.Args) {
			return nil, ErrContainerdAddressGiven
		}
		dir := filepath.Join(cfg.Dir, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("local: machine dir: %w", err)
		}
		b, err := json.Marshal(boot)
		if err != nil {
			return nil, err
		}
		bootPath := filepath.Join(dir, "bootstrap.json")
		if err := os.WriteFile(bootPath, b, 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("local: write bootstrap: %w", err)
		}
		ns := "wf-" + name
		// The machines share this host's bridge, so they share its address
		// leases too (Args may name another dir; the last flag wins).
		m := &process{cfg: cfg, name: name, dir: dir,
			args: []string{"--bootstrap", bootPath, "--data-dir", filepath.Join(dir, "agent"), "--containerd-namespace", ns,
				"--network-ipam-dir", filepath.Join(cfg.Dir, "ipam")}}
		if cfg.ContainerdPerMachine {
			m.ctrd = &ctrdproc.Config{Dir: filepath.Join(dir, "containerd"), Binary: cfg.ContainerdBinary, Namespaces: []string{ns},
				Log: cfg.Log.With(zap.String("machine", name))}
		}
		if err := m.start(ctx); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		return m, nil
	}
}

// NamesContainerdAddress reports whether agent flags args set
// --containerd-address.
func NamesContainerdAddress(args []string) bool {
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == "containerd-address" || strings.HasPrefix(a, "containerd-address=") {
			return true
		}
	}
	return false
}

// process is one machine: its agent process and, with a per-machine
// containerd, its daemon. It owns both: every stop ends the agent first,
// then the daemon (its tasks and shims with it).
type process struct {
	cfg  ExecConfig
	name string
	dir  string
	args []string
	// ctrd configures the machine's own containerd; nil on a shared one.
	ctrd *ctrdproc.Config

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	daemon *ctrdproc.Daemon
	// halting is set while halt ends the processes on purpose: the
	// daemon's exit then is no failure.
	halting bool
	gone    bool
}

func (p *process) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return errors.New("local: machine " + p.name + " was terminated")
	}
	args := p.args
	var daemon *ctrdproc.Daemon
	if p.ctrd != nil {
		d, err := ctrdproc.Start(ctx, *p.ctrd)
		if err != nil {
			return fmt.Errorf("local: machine %s: %w", p.name, err)
		}
		daemon = d
		args = append(append(args[:len(args):len(args)], "--containerd-address", d.Address), p.cfg.Args...)
	} else {
		args = append(args[:len(args):len(args)], p.cfg.Args...)
	}
	stopDaemon := func() {
		if daemon != nil {
			if err := daemon.Stop(context.Background()); err != nil {
				p.cfg.Log.Warn("local machine containerd: stop", zap.String("machine", p.name), zap.Error(err))
			}
		}
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		stopDaemon()
		return fmt.Errorf("local: agent log: %w", err)
	}
	cmd := exec.Command(p.cfg.AgentPath, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C meant for the control plane is not
	// the machine's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		stopDaemon()
		return fmt.Errorf("local: start agent: %w", err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.daemon, p.halting = cmd, done, daemon, false
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.cfg.Log.Info("local machine agent exited", zap.String("machine", p.name), zap.Error(err))
		close(done)
	}()
	if daemon != nil {
		// A machine whose containerd died is broken: end its agent too, so
		// the machine is observed failed rather than running blind. The
		// daemon itself stays the machine's to stop (its shims, mounts).
		go func() {
			select {
			case <-done:
				return
			case <-daemon.Exited():
			}
			p.mu.Lock()
			halting := p.halting
			p.mu.Unlock()
			if !halting {
				p.cfg.Log.Error("local machine containerd exited; ending its agent", zap.String("machine", p.name),
					zap.String("log", ctrdproc.Tail(daemon.LogPath, 1000)))
				_ = cmd.Process.Kill()
			}
		}()
	}
	p.cfg.Log.Info("local machine agent started", zap.String("machine", p.name), zap.Int("pid", cmd.Process.Pid),
		zap.Bool("own_containerd", daemon != nil))
	return nil
}

// halt ends the running agent (SIGTERM, then SIGKILL after the grace or
// when ctx ends), then the machine's containerd, if it has one.
func (p *process) halt(ctx context.Context) error {
	p.mu.Lock()
	cmd, done, daemon := p.cmd, p.done, p.daemon
	p.halting = true
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
	default:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(p.cfg.StopGrace)
		select {
		case <-done:
		case <-t.C:
			_ = cmd.Process.Kill()
			<-done
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
		}
		t.Stop()
	}
	if daemon == nil {
		return nil
	}
	// Stop uses its own context when ctx has ended: the daemon must end
	// whatever the caller's deadline, or it would be nobody's.
	sctx := ctx
	if ctx.Err() != nil {
		sctx = context.Background()
	}
	if err := daemon.Stop(sctx); err != nil {
		return fmt.Errorf("local: machine %s: %w", p.name, err)
	}
	return nil
}

func (p *process) Suspend(ctx context.Context) error { return p.halt(ctx) }
func (p *process) Resume(ctx context.Context) error  { return p.start(ctx) }

func (p *process) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.gone = true
	p.mu.Unlock()
	err := p.halt(ctx)
	// Nothing runs from the directory any more (halt ended the daemon even
	// if cleaning after it failed): remove it either way.
	return errors.Join(err, os.RemoveAll(p.dir))
}

func (p *process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}
