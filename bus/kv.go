package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// KV values are JSON so operators can read them with `nats kv get`.

// ErrNoChange lets a mutate function say the stored value is already right.
var ErrNoChange = errors.New("bus: no change")

// maxCASAttempts bounds a read-modify-write loop under contention.
const maxCASAttempts = 64

// GetJSON reads key and decodes it into v, returning the revision.
func GetJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("bus: decode %s/%s: %w", kv.Bucket(), key, err)
	}
	return e.Revision(), nil
}

// CreateJSON stores v under key only when key is absent
// (jetstream.ErrKeyExists otherwise).
func CreateJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	return kv.Create(ctx, key, b)
}

// UpdateJSON is a read → mutate → Update(rev) loop that retries on revision
// mismatch. mutate may return ErrNoChange to write nothing. It returns the
// value as stored and its revision.
func UpdateJSON[T any](ctx context.Context, kv jetstream.KeyValue, key string, mutate func(*T) error) (T, uint64, error) {
	var zero T
	for range maxCASAttempts {
		var v T
		rev, err := GetJSON(ctx, kv, key, &v)
		if err != nil {
			return zero, 0, err
		}
		if err := mutate(&v); err != nil {
			if errors.Is(err, ErrNoChange) {
				return v, rev, err
			}
			return zero, 0, err
		}
		b, err := json.Marshal(&v)
		if err != nil {
			return zero, 0, err
		}
		nrev, err := kv.Update(ctx, key, b, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return zero, 0, fmt.Errorf("bus: update %s/%s: %w", kv.Bucket(), key, err)
		}
		return v, nrev, nil
	}
	return zero, 0, fmt.Errorf("bus: update %s/%s: gave up after %d revision conflicts", kv.Bucket(), key, maxCASAttempts)
}
