package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

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
	_, rev, err := CreateJSONRaw(ctx, kv, key, v)
	return rev, err
}

// CreateJSONRaw is CreateJSON that also returns the bytes stored, for a
// caller that keeps them as a Seed for its next update.
func CreateJSONRaw(ctx context.Context, kv jetstream.KeyValue, key string, v any) ([]byte, uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, 0, err
	}
	rev, err := kv.Create(ctx, key, b)
	return b, rev, err
}

// Seed is a value of a key the caller already holds (from a watch, or its
// own last write), with the revision it was stored at.
type Seed struct {
	JSON     []byte
	Revision uint64
}

// UpdateJSON is a read → mutate → Update(rev) loop that retries on revision
// mismatch. mutate may return ErrNoChange to write nothing. It returns the
// value as stored and its revision.
func UpdateJSON[T any](ctx context.Context, kv jetstream.KeyValue, key string, mutate func(*T) error) (T, uint64, error) {
	v, rev, _, err := UpdateJSONFrom(ctx, kv, key, Seed{}, mutate)
	return v, rev, err
}

// UpdateJSONFrom is UpdateJSON whose first attempt starts from seed instead
// of a read, saving a round trip when the caller's copy is current. A stale
// seed costs one revision conflict. Only a write is trusted from a seed: if
// mutate refuses the seeded value (ErrNoChange or any error) the key is read
// and mutate asked again, so a stale copy never decides that nothing needs
// doing. It also returns the bytes stored, to seed the next update.
func UpdateJSONFrom[T any](ctx context.Context, kv jetstream.KeyValue, key string, seed Seed, mutate func(*T) error) (T, uint64, []byte, error) {
	var zero T
	// write stores v at rev; a revision mismatch is returned as is.
	write := func(v *T, rev uint64) (uint64, []byte, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return 0, nil, err
		}
		nrev, err := kv.Update(ctx, key, b, rev)
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			err = fmt.Errorf("bus: update %s/%s: %w", kv.Bucket(), key, err)
		}
		return nrev, b, err
	}
	if seed.Revision != 0 && len(seed.JSON) > 0 {
		var v T
		if json.Unmarshal(seed.JSON, &v) == nil && mutate(&v) == nil {
			nrev, b, err := write(&v, seed.Revision)
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				if err != nil {
					return zero, 0, nil, err
				}
				return v, nrev, b, nil
			}
		}
	}
	for range maxCASAttempts {
		var v T
		rev, err := GetJSON(ctx, kv, key, &v)
		if err != nil {
			return zero, 0, nil, err
		}
		if err := mutate(&v); err != nil {
			if errors.Is(err, ErrNoChange) {
				return v, rev, nil, err
			}
			return zero, 0, nil, err
		}
		nrev, b, err := write(&v, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return zero, 0, nil, err
		}
		return v, nrev, b, nil
	}
	return zero, 0, nil, fmt.Errorf("bus: update %s/%s: gave up after %d revision conflicts", kv.Bucket(), key, maxCASAttempts)
}

// Mirror watches every key of kv and hands each update to apply, on a
// goroutine that wg owns and that stops when ctx ends. It returns once the
// bucket's current values have been applied, so a caller reading its copy
// afterwards sees at least what kv held when Mirror was called.
func Mirror(ctx context.Context, wg *sync.WaitGroup, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("bus: watch %s: %w", kv.Bucket(), err)
	}
	primed := make(chan struct{})
	wg.Go(func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the end of the current values
					close(primed)
					continue
				}
				apply(e)
			}
		}
	})
	select {
	case <-primed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
