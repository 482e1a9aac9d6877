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
	pub, err := e.connect("floor-producer")
	if err != nil {
		return 0, err
	}
	cons, err := e.connect("floor-consumer")
	if err != nil {
		return 0, err
	}
	if _, err := pub.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_FLOOR", Subjects: []string{"bench.floor"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return 0, err
	}
	if _, err := pub.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_FLOOR_EV", Subjects: []string{"bench.floorev.>"},
		Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return 0, err
	}
	if _, err := pub.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_floor", Storage: jetstream.FileStorage}); err != nil {
		return 0, err
	}
	kv, err := cons.JS.KeyValue(ctx, "bench_floor")
	if err != nil {
		return 0, err
	}
	defer func() {
		_ = pub.JS.DeleteStream(ctx, "BENCH_FLOOR")
		_ = pub.JS.DeleteStream(ctx, "BENCH_FLOOR_EV")
		_ = pub.JS.DeleteKeyValue(ctx, "bench_floor")
	}()
	c, err := cons.JS.CreateOrUpdateConsumer(ctx, "BENCH_FLOOR", jetstream.ConsumerConfig{Durable: "floor",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024})
	if err != nil {
		return 0, err
	}
	var (
		done   atomic.Int64
		lastNs atomic.Int64
		failed atomic.Value
	)
	event := make([]byte, 160) // about an accepted event's size
	work := make(chan jetstream.Msg, floorWorkers)
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	for range floorWorkers {
		wg.Go(func() {
			for {
				var m jetstream.Msg
				select {
				case m = <-work:
				case <-wctx.Done():
					return
				}
				id := m.Headers().Get(jetstream.MsgIDHeader)
				if _, err := kv.Create(wctx, id, m.Data()); err != nil {
					failed.Store(err)
					continue
				}
				if _, err := cons.JS.PublishMsg(wctx, &nats.Msg{Subject: "bench.floorev." + id, Data: event},
					jetstream.WithMsgID(id+":1")); err != nil {
					failed.Store(err)
					continue
				}
				_ = m.Ack()
				done.Add(1)
				lastNs.Store(time.Now().UnixNano())
			}
		})
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
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
	}, pub.JS)
	if err != nil {
		return 0, fmt.Errorf("floor publish: %w", err)
	}
	for deadline := time.Now().Add(time.Minute); done.Load() < n; {
		if err, _ := failed.Load().(error); err != nil {
			return 0, fmt.Errorf("floor consumer: %w", err)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("floor: %d of %d recorded after a minute", done.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return float64(n) / time.Unix(0, lastNs.Load()).Sub(start).Seconds(), nil
}
