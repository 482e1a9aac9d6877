package output

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/nodelog"
)

// Dialer opens the connection one Run's output is shipped on and returns it
// with its closer. With NATS auth on, cmd/warmfleet-agent dials a login
// that may publish only that Run's log subject.
type Dialer func(ctx context.Context, runID string) (jetstream.JetStream, func(), error)

// Metrics receives the shipping figures (internal/metrics.AgentLogs).
type Metrics interface {
	// Shipped: a chunk of bytes (dropped of them dropped at the writer) is
	// stored, lag after the writer received its first byte.
	Shipped(stream string, bytes, dropped int64, lag time.Duration)
	// Behind: bytes written on this node and not yet stored, all attempts.
	Behind(bytes int64)
}

// Config is what a Shipper ships with.
type Config struct {
	DataDir string
	NodeID  string
	// JS is the node's own connection: a session's output ships on it,
	// and every Run's when Dialer is nil.
	JS     jetstream.JetStream
	Dialer Dialer
	// Poll is how often a running attempt's files are read for new lines.
	Poll time.Duration
	// RefusedWait is the longest wait between refused log logins before
	// they have gone on long (refusedWait when zero).
	RefusedWait time.Duration
	Now         func() time.Time
	Metrics     Metrics // nil: none
	Log         *zap.Logger
	// Group is the owner's: every shipment runs in it, under the context
	// Ship is given.
	Group *sync.WaitGroup
}

// Shipper ships every output directory of one agent, one Shipment each.
type Shipper struct {
	cfg    Config
	behind *backlog

	mu        sync.Mutex
	shipments map[string]*Shipment // by attempt id
}

// New returns a shipper that ships nothing yet.
func New(cfg Config) *Shipper {
	return &Shipper{cfg: cfg, behind: &backlog{metrics: cfg.Metrics, bytes: map[string][2]int64{}}, shipments: map[string]*Shipment{}}
}

// Dir is the output directory of an attempt.
func (s *Shipper) Dir(attemptID string) string { return filepath.Join(Root(s.cfg.DataDir), attemptID) }

// Shipment ships one attempt's output directory until both streams are
// stored to their end.
type Shipment struct {
	s    *Shipper
	dir  string
	meta meta
	// final is closed when the workload's output is complete (the runtime
	// finished it, or the workload is gone); the writer's done mark says
	// the same.
	final     chan struct{}
	finalOnce sync.Once
	done      chan struct{} // closed when run returns
	err       error         // why run returned; nil: everything is stored

	mu       sync.Mutex
	stored   bool // every byte and both ends are stored
	reported bool // the attempt's exit is reported and its workload removed
}

// Ship returns the attempt's shipment, starting it if none runs. A
// directory without its meta is an error matching os.ErrNotExist.
func (s *Shipper) Ship(ctx context.Context, attemptID string) (*Shipment, error) {
	dir := s.Dir(attemptID)
	m, err := readMeta(dir)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh, ok := s.shipments[attemptID]; ok {
		return sh, nil
	}
	sh := &Shipment{s: s, dir: dir, meta: m, final: make(chan struct{}), done: make(chan struct{})}
	s.shipments[attemptID] = sh
	s.cfg.Group.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.shipments, attemptID)
			s.mu.Unlock()
			close(sh.done)
		}()
		sh.err = sh.run(ctx)
		switch {
		case sh.err == nil:
			sh.settle(func() { sh.stored = true })
		case errors.Is(sh.err, errDropped):
			// Never marked stored: nothing is left to remove.
			s.cfg.Log.Warn("attempt output removed before it shipped; not shipping it", zap.String("workload", attemptID), zap.Error(sh.err))
		case ctx.Err() == nil:
			s.cfg.Log.Warn("attempt output not shipped; kept for the next start", zap.String("workload", attemptID), zap.Error(sh.err))
		}
	})
	return sh, nil
}

// Finish tells the shipment the output is complete.
func (sh *Shipment) Finish() { sh.finalOnce.Do(func() { close(sh.final) }) }

// Done is closed once the shipment stopped: everything is stored, the
// output was dropped, or its context ended.
func (sh *Shipment) Done() <-chan struct{} { return sh.done }

// ReportedDone records that the attempt's exit is reported and its
// workload removed: the directory goes once its output is stored too.
func (sh *Shipment) ReportedDone() { sh.settle(func() { sh.reported = true }) }

// settle records a fact and removes the directory once the output is
// stored and the exit reported, whichever comes last.
func (sh *Shipment) settle(fact func()) {
	sh.mu.Lock()
	fact()
	gone := sh.stored && sh.reported
	sh.mu.Unlock()
	if gone {
		if err := os.RemoveAll(sh.dir); err != nil {
			sh.s.cfg.Log.Warn("remove shipped output", zap.String("dir", sh.dir), zap.Error(err))
		}
	}
}

func (sh *Shipment) closed() bool {
	select {
	case <-sh.final:
		return true
	default:
		return false
	}
}

// errDropped: the output directory was removed while it waited to ship
// (an operator dropping output no login will ever be granted for).
var errDropped = errors.New("the output directory was removed before it shipped")

// Refused log logins are retried for as long as the agent runs: nats-server
// tells the agent only "authorization violation", whether the callout
// failed to read a record (transient) or the Run is no longer booked here,
// so no number of refusals proves the output unwanted. Waits grow to
// Config.RefusedWait (refusedWait), then to refusedWaitLong after
// refusedLongAfter refusals in a row, when the agent also logs, once, that
// the output is kept and how to drop it.
const (
	refusedWait      = 10 * time.Second
	refusedWaitLong  = 2 * time.Minute
	refusedLongAfter = 20
)

// ownConn reports whether the shipment goes on the node's own connection:
// no Dialer (no auth), or a session's output, not a Run's.
func (sh *Shipment) ownConn() bool { return sh.s.cfg.Dialer == nil || sh.meta.RunID == "" }

// dial opens the log connection, retrying until it is granted, ctx ends or
// the directory is removed.
func (sh *Shipment) dial(ctx context.Context) (jetstream.JetStream, func(), error) {
	cfg := &sh.s.cfg
	if sh.ownConn() {
		// A session's output goes on the node's own login, which may
		// publish every session's log subject, as it reads every
		// session's inbox (bus.PermsNode).
		return cfg.JS, func() {}, nil
	}
	refused := 0
	for wait := 250 * time.Millisecond; ; {
		js, closeJS, err := cfg.Dialer(ctx, sh.meta.RunID)
		if err == nil {
			if refused > 0 {
				cfg.Log.Info("log login admitted after refusals; shipping", zap.String("run_id", sh.meta.RunID), zap.Int("refused", refused))
			}
			return js, closeJS, nil
		}
		maxWait := cmp.Or(cfg.RefusedWait, refusedWait)
		if bus.IsAuthError(err) {
			refused++
			cfg.Log.Warn("log login refused; output kept, retrying", zap.String("run_id", sh.meta.RunID),
				zap.String("workload", sh.meta.AttemptID), zap.Int("refused", refused), zap.Error(err))
			if refused == refusedLongAfter {
				cfg.Log.Error("log login refused again and again; the output stays on this node and is retried every "+refusedWaitLong.String()+
					" (the Run may be gone from wf_runs or booked elsewhere); remove the directory to drop it",
					zap.String("run_id", sh.meta.RunID), zap.String("dir", sh.dir), zap.Int("refused", refused))
			}
			if refused >= refusedLongAfter {
				maxWait = refusedWaitLong
			}
		} else {
			cfg.Log.Warn("log connection not open; retrying", zap.String("run_id", sh.meta.RunID), zap.Error(err))
		}
		if !sleepCtx(ctx, wait) {
			return nil, nil, ctx.Err()
		}
		wait = min(wait*2, maxWait)
		if _, err := os.Stat(filepath.Join(sh.dir, metaFile)); errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: %s", errDropped, sh.dir)
		}
	}
}

// ShipLeftovers ships every output directory whose workload the runtime
// no longer holds (held says which it does): the agent died after removing
// it, before the last byte was stored. Each is removed once stored.
func (s *Shipper) ShipLeftovers(ctx context.Context, held map[string]bool) {
	entries, err := os.ReadDir(Root(s.cfg.DataDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		s.cfg.Log.Warn("list output dirs", zap.Error(err))
	}
	for _, e := range entries {
		if !e.IsDir() || held[e.Name()] {
			continue
		}
		sh, err := s.Ship(ctx, e.Name())
		if err != nil {
			s.cfg.Log.Warn("output dir without its meta; left in place", zap.String("dir", s.Dir(e.Name())), zap.Error(err))
			continue
		}
		sh.Finish()
		sh.ReportedDone()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backlog sums what every shipment has yet to store, for Metrics.
type backlog struct {
	mu      sync.Mutex
	metrics Metrics
	bytes   map[string][2]int64 // by attempt, by stream
}

func (b *backlog) set(attempt string, s nodelog.Stream, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.bytes[attempt]
	v[s] = n
	b.bytes[attempt] = v
	b.report()
}

func (b *backlog) forget(attempt string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.bytes, attempt)
	b.report()
}

func (b *backlog) report() {
	if b.metrics == nil {
		return
	}
	var total int64
	for _, v := range b.bytes {
		total += v[0] + v[1]
	}
	b.metrics.Behind(total)
}
