package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// countingKV is a real bucket that counts its reads.
type countingKV struct {
	jetstream.KeyValue
	gets atomic.Int32
}

func (c *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	c.gets.Add(1)
	return c.KeyValue.Get(ctx, key)
}

type counter struct {
	N    int  `json:"n"`
	Done bool `json:"done"`
}

// TestUpdateJSONFrom: a current seed writes without a read; a stale seed
// costs a conflict and still lands on the stored value; a stale seed that
// looks finished is not trusted to say there is nothing to do.
func TestUpdateJSONFrom(t *testing.T) {
	n := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := testenv.Dial(t, n.URL(), "test")
	raw, err := conn.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "seeds"})
	if err != nil {
		t.Fatal(err)
	}
	kv := &countingKV{KeyValue: raw}
	b, rev, err := bus.CreateJSONRaw(ctx, kv, "k", counter{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	incr := func(c *counter) error {
		if c.Done {
			return bus.ErrNoChange
		}
		c.N++
		return nil
	}

	// Current seed: one write, no read, and the bytes returned are stored.
	v, rev2, b2, err := bus.UpdateJSONFrom(ctx, kv, "k", bus.Seed{JSON: b, Revision: rev}, incr)
	if err != nil || v.N != 2 || kv.gets.Load() != 0 {
		t.Fatalf("current seed: v=%+v err=%v gets=%d, want n=2 and no read", v, err, kv.gets.Load())
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != string(b2) || e.Revision() != rev2 {
		t.Fatalf("returned bytes/revision are not what is stored: %v", err)
	}

	// Stale seed (revision 1, n=1): the write conflicts, the key is read,
	// and the increment applies to the stored n=2.
	kv.gets.Store(0)
	v, _, _, err = bus.UpdateJSONFrom(ctx, kv, "k", bus.Seed{JSON: b, Revision: rev}, incr)
	if err != nil || v.N != 3 || kv.gets.Load() != 1 {
		t.Fatalf("stale seed: v=%+v err=%v gets=%d, want n=3 after one read", v, err, kv.gets.Load())
	}

	// A stale seed saying "done" must not stop a change the stored value needs.
	done, _ := json.Marshal(counter{N: 9, Done: true})
	v, _, _, err = bus.UpdateJSONFrom(ctx, kv, "k", bus.Seed{JSON: done, Revision: rev}, incr)
	if err != nil || v.N != 4 {
		t.Fatalf("stale finished seed: v=%+v err=%v, want n=4", v, err)
	}

	// No change on the stored value is reported as such.
	if _, err := kv.Put(ctx, "k", done); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err = bus.UpdateJSONFrom(ctx, kv, "k", bus.Seed{}, incr); !errors.Is(err, bus.ErrNoChange) {
		t.Fatalf("stored value done: err=%v, want ErrNoChange", err)
	}
}
