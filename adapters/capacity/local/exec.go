package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// ExecConfig describes the agent processes ExecLauncher starts.
type ExecConfig struct {
	// AgentPath is the warmfleet-agent binary.
	AgentPath string
	// Dir holds one directory per machine: its bootstrap (0600), the
	// agent's data dir and its log. A machine's directory outlives a stop
	// and is removed when the machine is terminated.
	Dir string
	// Args are extra agent flags every machine gets (containerd address,
	// image dir, --nats-auth, …). Each machine also gets its own containerd
	// namespace, wf-<name>, so machines do not see each other's images and
	// containers.
	Args []string
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
			return nil, fmt.Errorf("local: write bootstrap: %w", err)
		}
		args := append([]string{"--bootstrap", bootPath, "--data-dir", filepath.Join(dir, "agent"),
			"--containerd-namespace", "wf-" + name}, cfg.Args...)
		m := &process{cfg: cfg, name: name, dir: dir, args: args}
		if err := m.start(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		return m, nil
	}
}

// process is one machine's agent process.
type process struct {
	cfg  ExecConfig
	name string
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	gone bool
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return errors.New("local: machine " + p.name + " was terminated")
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("local: agent log: %w", err)
	}
	cmd := exec.Command(p.cfg.AgentPath, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C meant for the control plane is not
	// the machine's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("local: start agent: %w", err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.cfg.Log.Info("local machine agent exited", zap.String("machine", p.name), zap.Error(err))
		close(done)
	}()
	p.cfg.Log.Info("local machine agent started", zap.String("machine", p.name), zap.Int("pid", cmd.Process.Pid))
	return nil
}

// halt ends the running agent: SIGTERM, then SIGKILL after the grace or
// when ctx ends.
func (p *process) halt(ctx context.Context) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(p.cfg.StopGrace)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	<-done
	return nil
}

func (p *process) Suspend(ctx context.Context) error { return p.halt(ctx) }
func (p *process) Resume(context.Context) error      { return p.start() }

func (p *process) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.gone = true
	p.mu.Unlock()
	if err := p.halt(ctx); err != nil {
		return err
	}
	return os.RemoveAll(p.dir)
}

func (p *process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}
