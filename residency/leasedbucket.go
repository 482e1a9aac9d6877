package residency

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
)

// StoreOptions configure the KV-backed session and location stores.
type StoreOptions struct {
	JS     jetstream.JetStream
	Clock  Clock
	Logger *zap.Logger
}

// leasedBucket is a KV store whose writes are checked against wf_leases:
// the session store and the location store both refuse a holder whose
// lease already went to a successor.
type leasedBucket struct {
	kv     jetstream.KeyValue
	leases jetstream.KeyValue
	clock  Clock
	log    *zap.Logger
}

// bindLeased binds bucket and wf_leases (bus.Provision creates them).
func bindLeased(ctx context.Context, js jetstream.JetStream, bucket string, clock Clock, log *zap.Logger, name string) (leasedBucket, error) {
	if js == nil {
		return leasedBucket{}, &InvalidOptionsError{Field: "JS", Reason: "required"}
	}
	if clock == nil {
		clock = SystemClock{}
	}
	if log == nil {
		log = zap.NewNop()
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return leasedBucket{}, fmt.Errorf("residency: bind %s: %w", bucket, err)
	}
	leases, err := js.KeyValue(ctx, bus.BucketLeases)
	if err != nil {
		return leasedBucket{}, fmt.Errorf("residency: bind %s: %w", bus.BucketLeases, err)
	}
	return leasedBucket{kv: kv, leases: leases, clock: clock, log: log.Named(name)}, nil
}

// holds refuses a write to key by host under epoch unless host holds the
// session's lease at exactly that epoch: a lease at a later epoch is
// ErrEpochSuperseded (the writer was a holder once, and a successor took
// over); no lease, a lower stored epoch or another holder is
// ErrNotLeaseHolder, so no node writes under an epoch it was never granted.
// It does not ask that the lease be live: a holder whose grant just ran out
// may still tombstone its own route, and the epoch fence keeps it off its
// successor's.
func (b leasedBucket) holds(ctx context.Context, key Key, host string, epoch ResidencyEpoch) error {
	var rec LeaseRecord
	_, err := bus.GetJSON(ctx, b.leases, key.String(), &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: %s has no lease; acquire it before writing", ErrNotLeaseHolder, key)
	case err != nil:
		return fmt.Errorf("residency: read lease %s: %w", key, err)
	case rec.Epoch > epoch:
		return fmt.Errorf("%w: %s lease is at epoch %d > %d", ErrEpochSuperseded, key, rec.Epoch, epoch)
	case rec.Epoch < epoch:
		return fmt.Errorf("%w: %s epoch %d was never granted (lease is at %d)", ErrNotLeaseHolder, key, epoch, rec.Epoch)
	case rec.Holder != host:
		return fmt.Errorf("%w: %s epoch %d is held by another node, not %s", ErrNotLeaseHolder, key, epoch, host)
	}
	return nil
}
