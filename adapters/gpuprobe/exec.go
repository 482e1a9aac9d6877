// Package gpuprobe is the agent's side of GPU facts: Exec runs
// cmd/warmfleet-gpu-probe (which links NVML; the agent must not, see
// adapters/nvml/doc.go), reads its JSON, and adds what the host's CDI specs
// offer (adapters/cdispec). Fake states cards for tests on machines without
// GPUs. Both implement agent.AcceleratorProbe.
package gpuprobe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/cdispec"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/schemas"
)

// BinaryName is the probe's executable, built by `make build` into the
// same directory as warmfleet-agent.
const BinaryName = "warmfleet-gpu-probe"

// DefaultTimeout bounds one probe run: NVML's first initialisation on a
// host without the persistence daemon takes seconds.
const DefaultTimeout = 10 * time.Second

// stderrTail is how much of the probe's stderr a failure log carries.
const stderrTail = 2048

var (
	// ErrProbeMissing: the probe binary is not where it was looked for.
	ErrProbeMissing = errors.New("GPU probe binary not found")
	// ErrProbeFailed: the probe ran but did not print facts (a crash, a
	// non-zero exit, a timeout).
	ErrProbeFailed = errors.New("GPU probe failed")
)

// Locate finds the probe binary: path when given, else BinaryName next to
// this process's executable, else on PATH. A miss is ErrProbeMissing.
func Locate(path string) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return path, fmt.Errorf("%w: %w", ErrProbeMissing, err)
		}
		return path, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), BinaryName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(BinaryName)
	if err != nil {
		return BinaryName, fmt.Errorf("%w: not next to this executable nor on PATH: %w", ErrProbeMissing, err)
	}
	return p, nil
}

// ExecConfig configures NewExec.
type ExecConfig struct {
	// Path is the probe binary (see Locate).
	Path string
	// Args are extra arguments (e.g. --nvml-library, --xid-window).
	Args []string
	// Timeout bounds one run; DefaultTimeout when zero.
	Timeout time.Duration
	// CDI, when set, is scanned on every probe to fill the CDI facts and
	// each card's CDI names. Nil states CDI unscanned.
	CDI *cdispec.Registry
	Log *zap.Logger
}

// Exec probes by running the probe binary. Safe for concurrent use.
type Exec struct {
	cfg ExecConfig
	log *zap.Logger

	mu       sync.Mutex
	lastFail string // the last failure logged at warn, so a repeat is not
}

var _ agent.AcceleratorProbe = (*Exec)(nil)

// NewExec returns a probe running cfg.Path.
func NewExec(cfg ExecConfig) *Exec {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Exec{cfg: cfg, log: cfg.Log.With(zap.String("probe", "gpu"), zap.String("binary", cfg.Path))}
}

// Probe runs the binary and states what it printed, with the CDI facts
// added. Any failure (binary missing, crash, timeout, malformed output) is
// logged and stated as nothing established.
func (e *Exec) Probe(ctx context.Context) schemas.AcceleratorFacts {
	facts, err := e.run(ctx)
	if err != nil {
		e.failed(err)
		return schemas.AcceleratorFacts{}
	}
	e.mu.Lock()
	e.lastFail = ""
	e.mu.Unlock()
	if e.cfg.CDI != nil {
		facts.CDI = e.cfg.CDI.Scan()
		Annotate(&facts)
	}
	return facts
}

// failed logs err at warn the first time in a row, at debug after.
func (e *Exec) failed(err error) {
	e.mu.Lock()
	repeat := e.lastFail == err.Error()
	e.lastFail = err.Error()
	e.mu.Unlock()
	if repeat {
		e.log.Debug("GPU probe still failing; stating nothing established", zap.Error(err))
		return
	}
	if errors.Is(err, ErrProbeMissing) {
		e.log.Warn("GPU probe binary missing; stating nothing established (build it with `make build`, or set --gpu-probe)", zap.Error(err))
		return
	}
	e.log.Warn("GPU probe failed; stating nothing established", zap.Error(err))
}

// limitedBuffer keeps the first max bytes written and counts the rest.
type limitedBuffer struct {
	buf      bytes.Buffer
	max      int
	overflow bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room < len(p) {
		b.overflow = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (e *Exec) run(ctx context.Context) (schemas.AcceleratorFacts, error) {
	if _, err := os.Stat(e.cfg.Path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return schemas.AcceleratorFacts{}, fmt.Errorf("%w: %s", ErrProbeMissing, e.cfg.Path)
		}
		return schemas.AcceleratorFacts{}, fmt.Errorf("%w: %w", ErrProbeFailed, err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cfg.Path, e.cfg.Args...)
	stdout := &limitedBuffer{max: MaxOutputBytes + 1}
	stderr := &tailBuffer{max: stderrTail}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A child the probe leaves behind holding its pipes must not hold
	// the agent past the kill.
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	tail := strings.TrimSpace(string(stderr.buf))
	if err != nil {
		if ctx.Err() != nil {
			return schemas.AcceleratorFacts{}, fmt.Errorf("%w: no answer in %v (killed): %w; stderr: %s", ErrProbeFailed, e.cfg.Timeout, ctx.Err(), tail)
		}
		return schemas.AcceleratorFacts{}, fmt.Errorf("%w: %w; stderr: %s", ErrProbeFailed, err, tail)
	}
	if stdout.overflow {
		return schemas.AcceleratorFacts{}, fmt.Errorf("%w: output over %d bytes", ErrMalformed, MaxOutputBytes)
	}
	facts, err := Decode(stdout.buf.Bytes())
	if err != nil {
		return schemas.AcceleratorFacts{}, err
	}
	e.log.Debug("GPU probe answered", zap.Duration("took", took), zap.Bool("established", facts.Established),
		zap.String("vendor", facts.Vendor), zap.Int("cards", len(facts.Cards)), zap.String("stderr", tail))
	return facts, nil
}
