package residency

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"
)

// updateJSON writes v at exactly revision rev (jetstream.ErrKeyRevisionMismatch
// otherwise). The read that chose rev is the caller's: bus.UpdateJSON's
// retry loop does not fit a renewal, which must fail rather than retry when
// the record moved on.
func updateJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	return kv.Update(ctx, key, b, rev)
}
