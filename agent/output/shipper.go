package output

import (
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
	Poll    time.Duration
	Now     func() time.Time
	Metrics Metrics // nil: none
	Log     *zap.Logger
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
		case errors.Is(sh.err, errLogRefused):
			// Kept, this output could never leave the node.
			s.cfg.Log.Error("attempt output dropped: this node may not ship it", zap.String("workload", attemptID), zap.Error(sh.err))
			sh.settle(func() { sh.stored = true })
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

// errLogRefused: NATS keeps refusing the Run's log login, so this node may
// not ship its output (the Run's attempt is booked elsewhere now).
var errLogRefused = errors.New("the Run's log login is refused")

// logLoginTries is how many refused log logins in a row mean "for good":
// one refusal may be the control plane failing to check the login.
const logLoginTries = 6

// dial opens the log connection, retrying until it is granted or ctx ends.
func (sh *Shipment) dial(ctx context.Context) (jetstream.JetStream, func(), error) {
	cfg := &sh.s.cfg
	if cfg.Dialer == nil || sh.meta.RunID == "" {
		// A session's output goes on the node's own login, which may
		// publish every session's log subject, as it reads every
		// session's inbox (bus.PermsNode).
		return cfg.JS, func() {}, nil
	}
	refused := 0
	for wait := 250 * time.Millisecond; ; wait = min(wait*2, 10*time.Second) {
		js, closeJS, err := cfg.Dialer(ctx, sh.meta.RunID)
		if err == nil {
			return js, closeJS, nil
		}
		if bus.IsAuthError(err) {
			if refused++; refused >= logLoginTries {
				return nil, nil, fmt.Errorf("%w: %w", errLogRefused, err)
			}
		}
		cfg.Log.Warn("log connection not open; retrying", zap.String("run_id", sh.meta.RunID), zap.Error(err))
		if !sleepCtx(ctx, wait) {
			return nil, nil, ctx.Err()
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
