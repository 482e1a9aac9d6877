package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// An ended Run stays in wf_runs for its retention, counted from the time it
// ended (PhaseSince), then the first replica to sweep purges it at the
// revision it read: a write since wins, and the other replicas' purges of
// it fail harmlessly. It is never purged before WF_EVENTS holds its
// outbox: the sweep publishes what WF_EVENTS lacks first (as the outbox
// repair does), and a Run whose publish fails is kept, and marked for the
// repair, until a later sweep finds it published.
//
// The purge removes every revision of the key and leaves one marker whose
// TTL (the bucket's LimitMarkerTTL) lets the server drop it too, so the
// bucket keeps no tombstone per Run. Once purged, the Run's request id
// names a new Run if submitted again: dedupe by request id lasts as long
// as the retention.
//
// A sweep reads the bucket's stream from its oldest message and stops at
// the first written after the cutoff, so it reads only what may be due,
// however many Runs the bucket holds. An ended Run's last write is its
// end, so its message there is its current value; an older revision of a
// Run the stream still holds is never an ended one (an end is final), and
// a Run purged leaves none.

// RetentionConfig tunes the sweeps.
type RetentionConfig struct {
	// Keep is how long an ended Run stays in wf_runs; it must be positive.
	Keep time.Duration
	// Interval is the time between sweeps; Keep/4, at most a minute, when 0.
	Interval time.Duration
	// Batch bounds the Runs one sweep purges; DefaultRetentionBatch when 0.
	// A full batch is followed by another sweep at once.
	Batch int
	// MarkerTTL is how long a purge's marker stays (bus.Topology's
	// RunsMarkerTTL).
	MarkerTTL time.Duration
}

// DefaultRetentionBatch is how many Runs one sweep purges at most.
const DefaultRetentionBatch = 1000

// sweepConsumerIdle is when the server drops a sweep's consumer that its
// sweep could not delete.
const sweepConsumerIdle = 30 * time.Second

// retentionWorkers is how many purges a sweep has in flight at once.
const retentionWorkers = 16

// Retention purges ended Runs from wf_runs once past their retention.
type Retention struct {
	store   *Store
	cfg     RetentionConfig
	removed atomic.Int64
}

// NewRetention returns the retention of s's Runs.
func NewRetention(s *Store, cfg RetentionConfig) (*Retention, error) {
	if cfg.Keep <= 0 {
		return nil, fmt.Errorf("runs: retention %s: an ended Run must be kept a positive time", cfg.Keep)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = min(cfg.Keep/4, time.Minute)
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultRetentionBatch
	}
	if cfg.MarkerTTL <= 0 {
		cfg.MarkerTTL = bus.RunPurgeMarkerTTL
	}
	return &Retention{store: s, cfg: cfg}, nil
}

// Removed counts the Runs this replica purged.
func (r *Retention) Removed() int64 { return r.removed.Load() }

// Run sweeps every Interval until ctx ends, and again at once after a
// sweep that filled its batch.
func (r *Retention) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := r.Sweep(ctx)
			if err != nil && ctx.Err() == nil {
				r.store.log.Warn("run retention sweep", zap.Error(err))
			}
			if n > 0 {
				r.store.log.Info("removed ended runs past their retention", zap.Int("runs", n), zap.Duration("retention", r.cfg.Keep))
			}
			if err != nil || n < r.cfg.Batch {
				break
			}
		}
	}
}

// expiredRun is an ended Run due for removal, as read at rev.
type expiredRun struct {
	id     string
	tenant string // its events' subject names it
	rev    uint64
	// seq is the Run's last event: WF_EVENTS must hold it.
	seq  uint64
	gaps bool
	// raw is the Run as stored, to publish its outbox from.
	raw []byte
}

// Sweep purges up to Batch ended Runs past their retention and returns how
// many it purged.
func (r *Retention) Sweep(ctx context.Context) (int, error) {
	due, err := r.expired(ctx, r.store.cfg.Now().Add(-r.cfg.Keep))
	if err != nil {
		return 0, err
	}
	events, err := r.store.js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return 0, fmt.Errorf("run retention: open %s: %w", bus.StreamEvents, err)
	}
	work := make(chan expiredRun)
	var purged atomic.Int64
	var wg sync.WaitGroup
	for range min(retentionWorkers, len(due)) {
		wg.Go(func() {
			for e := range work {
				if r.remove(ctx, events, e) {
					purged.Add(1)
				}
			}
		})
	}
	for _, e := range due {
		work <- e
	}
	close(work)
	wg.Wait()
	n := int(purged.Load())
	r.removed.Add(int64(n))
	return n, nil
}

// expired reads wf_runs' stream oldest write first, up to the first written
// after cutoff, and returns up to Batch ended Runs that ended at or before
// cutoff.
func (r *Retention) expired(ctx context.Context, cutoff time.Time) ([]expiredRun, error) {
	prefix := "$KV." + bus.BucketRuns + "."
	stream := "KV_" + bus.BucketRuns
	c, err := r.store.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"}, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: sweepConsumerIdle})
	if err != nil {
		return nil, fmt.Errorf("run retention: read %s: %w", bus.BucketRuns, err)
	}
	// A sweep's consumer goes with it, not when idle: sweeps follow each
	// other faster than that.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if ci := c.CachedInfo(); ci != nil {
			_ = r.store.js.DeleteConsumer(dctx, stream, ci.Name)
		}
	}()
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("run retention: read %s: %w", bus.BucketRuns, err)
	}
	if info.NumPending == 0 {
		return nil, nil
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("run retention: read %s: %w", bus.BucketRuns, err)
	}
	defer it.Stop()
	var due []expiredRun
	for len(due) < r.cfg.Batch {
		// A value purged or expired since the count was taken is not
		// coming: the wait ends the sweep instead of stalling it.
		m, err := it.Next(jetstream.NextMaxWait(2 * time.Second))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			return due, fmt.Errorf("run retention: read %s: %w", bus.BucketRuns, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		if meta.Timestamp.After(cutoff) {
			break // every later value was written later
		}
		if e, ok := expiredOf(m, strings.TrimPrefix(m.Subject(), prefix), meta.Sequence.Stream, cutoff); ok {
			due = append(due, e)
		}
		if meta.NumPending == 0 {
			break
		}
	}
	return due, nil
}

// expiredOf reads one current value of wf_runs: an ended Run that ended at
// or before cutoff is due. A marker, or a value that does not decode, is
// not.
func expiredOf(m jetstream.Msg, id string, rev uint64, cutoff time.Time) (expiredRun, bool) {
	if op := m.Headers().Get("KV-Operation"); op != "" {
		return expiredRun{}, false // a delete or purge marker
	}
	var run struct {
		Tenant     string            `json:"tenant"`
		Phase      schemas.Phase     `json:"phase"`
		PhaseSince time.Time         `json:"phase_since"`
		EventSeq   uint64            `json:"event_seq"`
		Outbox     []json.RawMessage `json:"outbox"`
	}
	if json.Unmarshal(m.Data(), &run) != nil || !run.Phase.Terminal() || run.PhaseSince.After(cutoff) {
		return expiredRun{}, false
	}
	tenant := schemas.Run{Tenant: run.Tenant}.TenantOf()
	return expiredRun{id: id, tenant: tenant, rev: rev, seq: run.EventSeq, gaps: len(run.Outbox) > 1, raw: m.Data()}, true
}

// remove purges one due Run at the revision read, once WF_EVENTS holds its
// outbox (published here if need be), and reports whether it did.
func (r *Retention) remove(ctx context.Context, events jetstream.Stream, e expiredRun) bool {
	if ctx.Err() != nil {
		return false // stopping: the next replica to sweep takes it
	}
	last := uint64(0)
	m, err := events.GetLastMsgForSubject(ctx, bus.RunEventsSubject(e.tenant, e.id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		if ctx.Err() == nil {
			r.store.log.Warn("run retention: read events", zap.String("run_id", e.id), zap.Error(err))
		}
		return false
	default:
		last = eventSeqOf(m.Header.Get(jetstream.MsgIDHeader), e.id)
	}
	if last < e.seq {
		var run schemas.Run
		if err := json.Unmarshal(e.raw, &run); err != nil {
			return false
		}
		if _, err := r.store.repairOutbox(ctx, events, run, e.gaps); err != nil {
			if ctx.Err() == nil {
				r.store.log.Warn("run retention: publish outbox", zap.String("run_id", e.id), zap.Error(err))
			}
			r.store.repair.mark(e.id, e.gaps)
			return false
		}
	}
	err = r.store.kv.Purge(ctx, e.id, jetstream.LastRevision(e.rev), jetstream.PurgeTTL(r.cfg.MarkerTTL))
	switch {
	case err == nil:
		return true
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return false // written since, or purged by another replica
	default:
		if ctx.Err() == nil {
			r.store.log.Warn("run retention: purge", zap.String("run_id", e.id), zap.Error(err))
		}
		return false
	}
}
