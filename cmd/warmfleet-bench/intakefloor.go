package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
)

// floorWorkers matches the control plane's intake pool.
const floorWorkers = 64

// intakeFloor measures the least that the intake goal's definition of
// "durably recorded" costs on this server, with no control-plane logic: the
// producers publish to a work-queue stream, and a consumer on its own
// connection, with as many workers as intake has, does for each message
// what intake must do at the least: a KV Create of the payload, one event
// publish-with-ack, and the ack. The rate (messages / first publish → last
// event) is the ceiling any control plane could reach here with these
// three writes per Run; intake's rate over it is how much of that ceiling
// warmfleet reaches.
func intakeFloor(ctx context.Context, e *env, producers int, d time.Duration, payload []byte, enc codec.Encoding, nonce string) (float64, error) {
	f, err := newFloorStore(ctx, e)
	if err != nil {
		return 0, err
	}
	defer f.remove(ctx)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	work := make(chan jetstream.Msg, floorWorkers)
	for range floorWorkers {
		wg.Go(func() { f.record(wctx, work) })
	}
	cc, err := f.consumer.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-wctx.Done():
		}
	})
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	start := time.Now()
	n, _, err := publishFor(ctx, producers, d, func(p, i int) *nats.Msg {
		m := &nats.Msg{Subject: "bench.floor", Data: payload, Header: nats.Header{}}
		m.Header.Set(codec.ContentTypeHeader, enc.ContentType())
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("floor-%s-%02d-%07d", nonce, p, i))
		return m
	}, f.pub.JS)
	if err != nil {
		return 0, fmt.Errorf("floor publish: %w", err)
	}
	if err := f.wait(ctx, n, time.Minute); err != nil {
		return 0, err
	}
	return float64(n) / time.Unix(0, f.lastNs.Load()).Sub(start).Seconds(), nil
}

// floorStore is the floor's work-queue stream, event stream and bucket,
// and the consumer whose workers record each message in them.
type floorStore struct {
	pub, cons *bus.Conn
	kv        jetstream.KeyValue
	consumer  jetstream.Consumer
	event     []byte // about an accepted event's size
	done      atomic.Int64
	lastNs    atomic.Int64 // when the last message was recorded
	failed    atomic.Value
}

func newFloorStore(ctx context.Context, e *env) (*floorStore, error) {
	f := &floorStore{event: make([]byte, 160)}
	var err error
	if f.pub, err = e.connect("floor-producer"); err != nil {
		return nil, err
	}
	if f.cons, err = e.connect("floor-consumer"); err != nil {
		return nil, err
	}
	if _, err := f.pub.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_FLOOR", Subjects: []string{"bench.floor"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return nil, err
	}
	if _, err := f.pub.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_FLOOR_EV", Subjects: []string{"bench.floorev.>"},
		Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return nil, err
	}
	if _, err := f.pub.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_floor", Storage: jetstream.FileStorage}); err != nil {
		return nil, err
	}
	if f.kv, err = f.cons.JS.KeyValue(ctx, "bench_floor"); err != nil {
		return f, err
	}
	f.consumer, err = f.cons.JS.CreateOrUpdateConsumer(ctx, "BENCH_FLOOR", jetstream.ConsumerConfig{Durable: "floor",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024})
	return f, err
}

func (f *floorStore) remove(ctx context.Context) {
	_ = f.pub.JS.DeleteStream(ctx, "BENCH_FLOOR")
	_ = f.pub.JS.DeleteStream(ctx, "BENCH_FLOOR_EV")
	_ = f.pub.JS.DeleteKeyValue(ctx, "bench_floor")
}

// record is one worker: for each message, the KV Create, the event
// publish-with-ack, the ack.
func (f *floorStore) record(ctx context.Context, work <-chan jetstream.Msg) {
	for {
		var m jetstream.Msg
		select {
		case m = <-work:
		case <-ctx.Done():
			return
		}
		id := m.Headers().Get(jetstream.MsgIDHeader)
		if _, err := f.kv.Create(ctx, id, m.Data()); err != nil {
			f.failed.Store(err)
			continue
		}
		if _, err := f.cons.JS.PublishMsg(ctx, &nats.Msg{Subject: "bench.floorev." + id, Data: f.event},
			jetstream.WithMsgID(id+":1")); err != nil {
			f.failed.Store(err)
			continue
		}
		_ = m.Ack()
		f.done.Add(1)
		f.lastNs.Store(time.Now().UnixNano())
	}
}

// wait waits until the workers have recorded n messages.
func (f *floorStore) wait(ctx context.Context, n int64, within time.Duration) error {
	return poll(ctx, 5*time.Millisecond, time.Now().Add(within), func() (bool, error) {
		if f.done.Load() >= n {
			return true, nil
		}
		if err, _ := f.failed.Load().(error); err != nil {
			return false, fmt.Errorf("floor consumer: %w", err)
		}
		return false, nil
	}, func() error { return fmt.Errorf("floor: %d of %d recorded after a minute", f.done.Load(), n) })
}
