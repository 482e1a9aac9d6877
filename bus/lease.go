package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Leases in wf_leases follow one set of CAS rules (docs/sessions.md):
// absent → Create at epoch 1; expired → Update at the read revision to
// epoch+1; live → held; renew = Update at the holder's own revision, where
// a conflict loses it unless the stored record is still the holder's own (a
// write whose answer was lost); release = Update to a record that expires
// now and keeps the epoch, never a delete (that would reset the next holder
// to epoch 1).
// Lease carries those mechanics; who may hold a key, and what its record
// says besides epoch and expiry, is its user's policy.

var (
	// ErrLeaseHeld: the record is live and not the caller's.
	ErrLeaseHeld = errors.New("bus: lease held")
	// ErrLeaseLost: the record a holder wrote has moved on (another
	// holder or epoch, a release, an expiry, or the key is gone).
	ErrLeaseLost = errors.New("bus: lease lost")
)

// LeaseRecord is what the lease mechanics read from a stored lease value.
type LeaseRecord interface {
	// LeaseEpoch is the record's epoch (or term): 1 for the first holder,
	// one more for each takeover of an expired record; a renewal and a
	// release keep it.
	LeaseEpoch() uint64
	// LeaseExpiresAt is when the record stops holding the lease. It is the
	// record's own expires_at, never a KV TTL: an Update drops a per-key
	// TTL.
	LeaseExpiresAt() time.Time
}

// LeaseLive reports whether r holds its lease at now.
func LeaseLive(r LeaseRecord, now time.Time) bool { return now.Before(r.LeaseExpiresAt()) }

// TakeoverEpoch is the epoch at which a new holder may take the record Read
// returned at rev: 1 when the key is absent (rev 0), the stored epoch+1 once
// it has expired at now. ok is false while the record is live.
func TakeoverEpoch(cur LeaseRecord, rev uint64, now time.Time) (epoch uint64, ok bool) {
	if rev == 0 {
		return 1, true
	}
	if LeaseLive(cur, now) {
		return 0, false
	}
	return cur.LeaseEpoch() + 1, true
}

// Lease is one key's lease in a KV bucket, stored as JSON records of type R.
// It is a plain value: build one per key where it is needed.
type Lease[R LeaseRecord] struct {
	KV  jetstream.KeyValue
	Key string
	// Decode decodes a stored value into a record; json.Unmarshal when nil.
	Decode func(data []byte, v any) error
}

// Read returns the stored record and its revision; revision 0 with no error
// when the key is absent. A value that does not decode is an error wrapping
// Decode's.
func (l Lease[R]) Read(ctx context.Context) (R, uint64, error) {
	var rec R
	e, err := l.KV.Get(ctx, l.Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, 0, nil
	}
	if err != nil {
		return rec, 0, err
	}
	decode := l.Decode
	if decode == nil {
		decode = json.Unmarshal
	}
	if err := decode(e.Value(), &rec); err != nil {
		var zero R
		return zero, 0, fmt.Errorf("bus: decode lease %s/%s: %w", l.KV.Bucket(), l.Key, err)
	}
	return rec, e.Revision(), nil
}

// Write stores rec over the record read at rev: Create when rev is 0
// (jetstream.ErrKeyExists when another writer created it first), else
// Update at exactly rev (jetstream.ErrKeyRevisionMismatch when the record
// moved on). It returns the new revision.
func (l Lease[R]) Write(ctx context.Context, rec R, rev uint64) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return l.KV.Create(ctx, l.Key, b)
	}
	return l.KV.Update(ctx, l.Key, b, rev)
}

// Acquire takes the lease for the record mk builds at the epoch the takeover
// gets (TakeoverEpoch), retrying a read → write round on every conflict. A
// live record is refused with ErrLeaseHeld, returned with its revision for
// the caller to name the holder, unless own says it is the caller's (a
// repeat of an acquire whose answer was lost): that record is returned as it
// stands, unwritten. A write that fails otherwise is settled by a reread: if
// the stored record is own, the write landed and its answer was lost. now is
// asked once per round.
func (l Lease[R]) Acquire(ctx context.Context, now func() time.Time, mk func(epoch uint64, now time.Time) R, own func(R) bool) (R, uint64, error) {
	var zero R
	for range maxCASAttempts {
		t := now()
		cur, rev, err := l.Read(ctx)
		if err != nil {
			return zero, 0, fmt.Errorf("bus: read lease %s/%s: %w", l.KV.Bucket(), l.Key, err)
		}
		epoch, free := TakeoverEpoch(cur, rev, t)
		if !free {
			if own(cur) {
				return cur, rev, nil
			}
			return cur, rev, ErrLeaseHeld
		}
		rec := mk(epoch, t)
		nrev, err := l.Write(ctx, rec, rev)
		switch {
		case err == nil:
			return rec, nrev, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			continue
		}
		if cur, crev, rerr := l.Read(ctx); rerr == nil && crev != 0 && own(cur) {
			return cur, crev, nil
		}
		return zero, 0, fmt.Errorf("bus: write lease %s/%s: %w", l.KV.Bucket(), l.Key, err)
	}
	return zero, 0, fmt.Errorf("bus: acquire lease %s/%s: gave up after %d conflicts", l.KV.Bucket(), l.Key, maxCASAttempts)
}

// WriteOwn CAS-writes rec (a renewal, or a release: a record that expires
// now and keeps the epoch) over the holder's own record at rev. On a
// revision conflict it rereads: a write of the holder's own whose answer was
// lost moves the revision but not the lease, so when the stored record is
// still live at now and own (asked only of a live record) the write is
// retried at the new revision. Anything else is ErrLeaseLost. Every write is an Update, never a Create.
func (l Lease[R]) WriteOwn(ctx context.Context, rec R, rev uint64, now time.Time, own func(R) bool) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	for range maxCASAttempts {
		nrev, err := l.KV.Update(ctx, l.Key, b, rev)
		if err == nil {
			return nrev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, fmt.Errorf("bus: write lease %s/%s: %w", l.KV.Bucket(), l.Key, err)
		}
		cur, crev, err := l.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("bus: lease %s/%s: reread after conflict: %w", l.KV.Bucket(), l.Key, err)
		}
		if crev == 0 || !LeaseLive(cur, now) || !own(cur) {
			return 0, ErrLeaseLost
		}
		rev = crev
	}
	return 0, fmt.Errorf("bus: write lease %s/%s: gave up after %d conflicts", l.KV.Bucket(), l.Key, maxCASAttempts)
}
