package residency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// LeaseRecord is a session lease as stored in wf_leases (JSON, so operators
// can read it with `nats kv get wf_leases <tenant>.<session>`).
type LeaseRecord = schemas.SessionLeaseRecord

// KVLeasesOptions configures KVLeases.
type KVLeasesOptions struct {
	// JS reaches wf_leases and creates inbox consumers. Required.
	JS jetstream.JetStream
	// TTL is every grant's lifetime from its last renewal. Required.
	TTL time.Duration
	// InboxAckWait is the AckWait of the inbox consumers this store creates
	// (bus.InboxConsumerConfig's default when zero). It must exceed the
	// longest a handler takes.
	InboxAckWait time.Duration
	// Clock stamps granted_at and expires_at; SystemClock when nil.
	Clock  Clock
	Logger *zap.Logger
}

// KVLeases is the control plane's SessionLeases over wf_leases.
//
// It is control-plane code: it writes KV and creates consumers, which agents
// may not. A host-side Manager reaches it directly in-process or, in an agent,
// through a request/reply client of SessionLeases.
type KVLeases struct {
	kv           jetstream.KeyValue
	js           jetstream.JetStream
	ttl          time.Duration
	inboxAckWait time.Duration
	clock        Clock
	log          *zap.Logger
}

var _ SessionLeases = (*KVLeases)(nil)

// NewKVLeases binds wf_leases (bus.Provision creates it).
func NewKVLeases(ctx context.Context, o KVLeasesOptions) (*KVLeases, error) {
	if o.JS == nil {
		return nil, &InvalidOptionsError{Field: "JS", Reason: "required"}
	}
	if o.TTL <= 0 {
		return nil, &InvalidOptionsError{Field: "TTL", Reason: "must be positive"}
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	kv, err := o.JS.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return nil, fmt.Errorf("residency: bind %s: %w", bus.BucketLeases, err)
	}
	return &KVLeases{kv: kv, js: o.JS, ttl: o.TTL, inboxAckWait: o.InboxAckWait, clock: o.Clock, log: o.Logger.Named("leases")}, nil
}

// Get reads a session's lease record and its revision.
func (s *KVLeases) Get(ctx context.Context, key Key) (LeaseRecord, uint64, error) {
	var rec LeaseRecord
	rev, err := bus.GetJSON(ctx, s.kv, key.String(), &rec)
	return rec, rev, err
}

// AcquireSessionLease implements SessionLeases: absent → Create at epoch 1;
// expired → CAS Update to epoch+1; live → ErrLeaseHeld. It then makes sure
// the session's durable inbox consumer exists; if that fails the grant is
// released again, and if that fails too the error is a *LeaseCleanupError.
func (s *KVLeases) AcquireSessionLease(ctx context.Context, key Key, holder string) (LeaseGrant, error) {
	return s.AcquireSessionLeaseToken(ctx, key, holder, newToken())
}

// AcquireSessionLeaseToken is AcquireSessionLease under a token the caller
// chose, which makes it idempotent: a live lease already granted to the same
// holder under the same token (a repeat of a request whose answer was lost)
// is granted again as it stands, not refused as held.
func (s *KVLeases) AcquireSessionLeaseToken(ctx context.Context, key Key, holder, token string) (LeaseGrant, error) {
	if err := key.Validate(); err != nil {
		return LeaseGrant{}, err
	}
	if holder == "" || token == "" {
		return LeaseGrant{}, fmt.Errorf("%w: lease holder and token are required", ErrInvalidRequest)
	}
	g, err := s.acquire(ctx, key, holder, token)
	if err != nil {
		return LeaseGrant{}, err
	}
	if s.js != nil {
		cfg := bus.InboxConsumerConfig(key.Tenant, key.Session, s.inboxAckWait)
		if _, err := s.js.CreateOrUpdateConsumer(ctx, bus.StreamInbox, cfg); err != nil {
			err = fmt.Errorf("residency: create inbox consumer for %s: %w", key, err)
			if rerr := s.ReleaseSessionLease(ctx, g); rerr != nil {
				return LeaseGrant{}, &LeaseCleanupError{
					Cause:   errors.Join(err, fmt.Errorf("release after failed consumer: %w", rerr)),
					Cleanup: func(ctx context.Context) error { return s.ReleaseSessionLease(ctx, g) },
				}
			}
			return LeaseGrant{}, err
		}
	}
	s.log.Debug("lease granted", zap.Stringer("key", key), zap.String("holder", holder), zap.Uint64("epoch", uint64(g.Epoch)))
	return g, nil
}

func (s *KVLeases) acquire(ctx context.Context, key Key, holder, token string) (LeaseGrant, error) {
	mk := func(epoch uint64, now time.Time) LeaseRecord {
		return LeaseRecord{
			Tenant: key.Tenant, Session: key.Session, Holder: holder, Epoch: ResidencyEpoch(epoch),
			GrantedAt: now, ExpiresAt: now.Add(s.ttl), Token: token,
		}
	}
	// Ours: a live grant to this holder under this token (a repeat of a
	// request whose answer was lost), or our own write whose answer was lost.
	own := func(cur LeaseRecord) bool { return cur.Holder == holder && cur.Token == token && !cur.Released }
	rec, rev, err := s.lease(key).Acquire(ctx, s.clock.Now, mk, own)
	if errors.Is(err, bus.ErrLeaseHeld) {
		return LeaseGrant{}, fmt.Errorf("%w: %s held by %s at epoch %d until %s",
			ErrLeaseHeld, key, rec.Holder, rec.Epoch, rec.ExpiresAt.Format(time.RFC3339Nano))
	}
	if err != nil {
		return LeaseGrant{}, fmt.Errorf("residency: acquire lease %s: %w", key, err)
	}
	return s.grant(key, rec, rev), nil
}

// lease is key's record in wf_leases, for bus's CAS lease mechanics.
func (s *KVLeases) lease(key Key) bus.Lease[LeaseRecord] {
	return bus.Lease[LeaseRecord]{KV: s.kv, Key: key.String()}
}

func (s *KVLeases) grant(key Key, rec LeaseRecord, rev uint64) LeaseGrant {
	return LeaseGrant{Key: WireKey(key), Holder: rec.Holder, Epoch: rec.Epoch, Revision: rev, TTL: s.ttl, GrantedAt: rec.GrantedAt, ExpiresAt: rec.ExpiresAt, Token: rec.Token}
}

// RenewSessionLease implements SessionLeases: a CAS Update at the grant's
// own revision. An expired grant is not revived, even if nobody took it.
func (s *KVLeases) RenewSessionLease(ctx context.Context, g LeaseGrant) (LeaseGrant, error) {
	now := s.clock.Now()
	if !now.Before(g.ExpiresAt) {
		return LeaseGrant{}, fmt.Errorf("%w: %s epoch %d expired at %s", ErrLeaseLost, KeyOf(g.Key), g.Epoch, g.ExpiresAt.Format(time.RFC3339Nano))
	}
	rec := LeaseRecord{
		Tenant: g.Key.Tenant, Session: g.Key.Session, Holder: g.Holder, Epoch: g.Epoch,
		GrantedAt: g.GrantedAt, RenewedAt: now, ExpiresAt: now.Add(s.ttl), Token: g.Token,
	}
	rev, err := s.writeOwn(ctx, "renew", g, rec, now)
	if err != nil {
		return LeaseGrant{}, err
	}
	return s.grant(KeyOf(g.Key), rec, rev), nil
}

// ReleaseSessionLease implements SessionLeases: it CAS-writes an "expired
// now" record that keeps the epoch, so the next holder gets epoch+1. It never
// deletes: that would reset the next holder to epoch 1.
func (s *KVLeases) ReleaseSessionLease(ctx context.Context, g LeaseGrant) error {
	now := s.clock.Now()
	rec := LeaseRecord{
		Tenant: g.Key.Tenant, Session: g.Key.Session, Holder: g.Holder, Epoch: g.Epoch,
		GrantedAt: g.GrantedAt, RenewedAt: now, ExpiresAt: now, Released: true, Token: g.Token,
	}
	_, err := s.writeOwn(ctx, "release", g, rec, now)
	return err
}

// writeOwn CAS-writes rec over the grant g, once the stored record shows
// g is the lease as granted (heldBy): the grant's revision, epoch and
// holder come from the caller and prove nothing; its token, known only to
// the holder it was granted to, does. A conflict rereads the record:
// a write of ours whose answer was lost (a renewal cancelled or timed out in
// flight) moves the revision but not the grant, so the token — unique to one
// grant — decides whether the record is still ours, and the write is retried
// at the new revision. Any other holder, epoch, a release or an expiry is
// ErrLeaseLost.
func (s *KVLeases) writeOwn(ctx context.Context, op string, g LeaseGrant, rec LeaseRecord, now time.Time) (uint64, error) {
	key := KeyOf(g.Key)
	own := func(cur LeaseRecord) bool {
		if cur.Token != g.Token || cur.Epoch != g.Epoch || cur.Holder != g.Holder || cur.Released {
			return false
		}
		s.log.Debug("lease write conflicted with a lost write of our own; retrying", zap.Stringer("key", key))
		return true
	}
	cur, crev, err := s.lease(key).Read(ctx)
	if err != nil {
		return 0, fmt.Errorf("residency: %s lease %s: %w", op, key, err)
	}
	if err := heldBy(key, g, cur, crev, op == "renew", now); err != nil {
		return 0, err
	}
	rev, err := s.lease(key).WriteOwn(ctx, rec, crev, now, own)
	if errors.Is(err, bus.ErrLeaseLost) {
		return 0, fmt.Errorf("%w: %s epoch %d: record moved on", ErrLeaseLost, key, g.Epoch)
	}
	if err != nil {
		return 0, fmt.Errorf("residency: %s lease %s: %w", op, key, err)
	}
	return rev, nil
}

// heldBy refuses a renewal or release of g unless the record stored at rev
// is g's grant (DESIGN's invariant 3 keeps epochs rising, so a stored epoch
// above g's is a successor's: ErrLeaseLost). A renewal also needs the
// stored record live: an expired grant is not revived.
func heldBy(key Key, g LeaseGrant, cur LeaseRecord, rev uint64, renew bool, now time.Time) error {
	switch {
	case rev == 0:
		return fmt.Errorf("%w: %s has no lease", ErrNotLeaseHolder, key)
	case cur.Epoch > g.Epoch:
		return fmt.Errorf("%w: %s epoch %d: a later epoch %d was granted", ErrLeaseLost, key, g.Epoch, cur.Epoch)
	case cur.Epoch != g.Epoch || cur.Holder != g.Holder || cur.Token != g.Token:
		return fmt.Errorf("%w: %s epoch %d is not the grant the lease holds", ErrNotLeaseHolder, key, g.Epoch)
	case cur.Released:
		return fmt.Errorf("%w: %s epoch %d was released", ErrLeaseLost, key, g.Epoch)
	case renew && !cur.Live(now):
		return fmt.Errorf("%w: %s epoch %d expired at %s", ErrLeaseLost, key, g.Epoch, cur.ExpiresAt.Format(time.RFC3339Nano))
	}
	return nil
}

// maxCASAttempts bounds a read → write loop under contention.
const maxCASAttempts = 64

// newToken mints a grant's token: 12 random bytes in hex.
func newToken() string { return randid.Hex("", 12) }
