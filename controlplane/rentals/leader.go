package rentals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// LeaderKey is the wf_leases key of the rental loop's leader lease.
// A '/' cannot appear in a residency key (<tenant>.<session> of letters,
// digits, '-' and '_'), so it never collides with a session's lease.
const LeaderKey = "controlplane/rentals"

// leaderLease elects one control-plane replica to run the rental loop (the
// janitor, retirement, every provider call and every decision to rent): the
// holder of a KV lease in wf_leases. Acquire is Create (absent) or a CAS
// Update of an expired record (term+1); renewal is a CAS Update at the
// revision this holder wrote, so a replica that lost the lease learns it on
// its next renewal and stops leading at once. A holder believes its own
// lease only until a margin before expiry, so a paused leader stops before
// another may start.
type leaderLease struct {
	kv     jetstream.KeyValue
	holder string
	ttl    time.Duration
	log    *zap.Logger

	mu    sync.Mutex
	rev   uint64    // revision this holder last wrote; 0 when not leading
	term  uint64    // term this holder leads in
	until time.Time // leading until (local clock, margin taken off)
}

func newLeaderLease(kv jetstream.KeyValue, ttl time.Duration, log *zap.Logger) *leaderLease {
	return &leaderLease{kv: kv, holder: randid.Hex("cp-", 8), ttl: ttl, log: log}
}

// lease is the rental loop's record in wf_leases, decoded strictly.
func (l *leaderLease) lease() bus.Lease[schemas.RentalLeader] {
	return bus.Lease[schemas.RentalLeader]{KV: l.kv, Key: LeaderKey, Decode: func(b []byte, v any) error {
		return codec.Decode(codec.JSON, b, v)
	}}
}

// leading reports whether this replica holds the lease now.
func (l *leaderLease) leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev != 0 && time.Now().Before(l.until)
}

// run acquires and renews the lease every ttl/3 until ctx ends, then
// releases it so another replica takes over without waiting out the TTL.
func (l *leaderLease) run(ctx context.Context) {
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		if err := l.step(ctx); err != nil && ctx.Err() == nil {
			l.log.Debug("rental leader lease", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l.release(rctx)
			cancel()
			return
		case <-t.C:
		}
	}
}

// step acquires the lease when it is free or expired, renews it when this
// replica holds it, and otherwise notes who does.
func (l *leaderLease) step(ctx context.Context) error {
	start := time.Now()
	cur, rev, err := l.lease().Read(ctx)
	switch {
	case errors.Is(err, codec.ErrMalformed):
		return fmt.Errorf("decode leader lease: %w", err)
	case err != nil:
		l.lose("lease unreadable: " + err.Error())
		return err
	}
	l.mu.Lock()
	mine := l.rev != 0 && rev == l.rev && cur.Holder == l.holder
	l.mu.Unlock()
	switch {
	case mine:
		return l.write(ctx, start, rev, cur.Term)
	case cur.Holder == l.holder && start.Before(cur.ExpiresAt):
		// Ours by record but not by the revision we remember (a write
		// whose answer was lost): renew at the stored revision.
		return l.write(ctx, start, rev, cur.Term)
	}
	if term, ok := bus.TakeoverEpoch(cur, rev, start); ok {
		return l.write(ctx, start, rev, term)
	}
	l.lose("held by " + cur.Holder)
	return nil
}

// write stores this replica as holder at rev (0: create) in term.
func (l *leaderLease) write(ctx context.Context, start time.Time, rev, term uint64) error {
	nrev, err := l.lease().Write(ctx, schemas.RentalLeader{Holder: l.holder, Term: term, ExpiresAt: start.Add(l.ttl)}, rev)
	if err != nil {
		l.lose("lease write refused: " + err.Error())
		return err
	}
	l.mu.Lock()
	was := l.rev != 0
	l.rev, l.term = nrev, term
	// Believe the lease until a fifth of its life before it ends, timed
	// from before the read: a slow write only shortens it.
	l.until = start.Add(l.ttl - l.ttl/5)
	l.mu.Unlock()
	if !was {
		l.log.Info("leading the rental loop", zap.String("holder", l.holder), zap.Uint64("term", term))
	}
	return nil
}

func (l *leaderLease) lose(why string) {
	l.mu.Lock()
	was := l.rev != 0
	l.rev, l.until = 0, time.Time{}
	l.mu.Unlock()
	if was {
		l.log.Warn("no longer leading the rental loop", zap.String("holder", l.holder), zap.String("why", why))
	}
}

// release writes the lease as expired now, keeping its term, if this
// replica still holds it at the revision it wrote.
func (l *leaderLease) release(ctx context.Context) {
	l.mu.Lock()
	rev, term := l.rev, l.term
	l.rev, l.until = 0, time.Time{}
	l.mu.Unlock()
	if rev == 0 {
		return
	}
	if _, err := l.lease().Write(ctx, schemas.RentalLeader{Holder: l.holder, Term: term, ExpiresAt: time.Now()}, rev); err != nil {
		l.log.Info("leader lease not released; it expires on its own", zap.Error(err))
		return
	}
	l.log.Info("released the rental loop's lease", zap.String("holder", l.holder))
}

// openLeaderLease binds wf_leases for the rental loop's election.
func openLeaderLease(ctx context.Context, conn *bus.Conn, ttl time.Duration, log *zap.Logger) (*leaderLease, error) {
	kv, err := conn.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return nil, fmt.Errorf("rentals: open %s: %w", bus.BucketLeases, err)
	}
	return newLeaderLease(kv, ttl, log), nil
}
