package residency

import (
	"context"
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
