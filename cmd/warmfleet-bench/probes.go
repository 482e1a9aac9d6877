package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
)

// sampling is how many round trips a measurement times, and the pause
// before each one: none sends them back to back.
type sampling struct {
	warmup, samples int
	pace            time.Duration
}

// roundTrip times one round trip of one kind; i numbers the sample.
type roundTrip struct {
	name string
	once func(ctx context.Context, i int) (time.Duration, error)
}

// probe is a round trip ready to be timed, and what it holds open.
type probe struct {
	roundTrip
	close func()
}

// interleave takes the kinds in turn within each sample, rotating which
// goes first, so that all of them see the same machine: on a shared host
// the load drifts within seconds, and a baseline timed a few seconds
// before its subject is not a same-run baseline. The warm-up samples are
// not kept.
func interleave(ctx context.Context, sm sampling, rts ...roundTrip) ([][]time.Duration, error) {
	next := 0
	if _, err := sampleWhile(ctx, &next, sm.warmup, sm.pace, nil, rts...); err != nil {
		return nil, err
	}
	return sampleWhile(ctx, &next, sm.samples, sm.pace, nil, rts...)
}

// sampleWhile takes one of each round trip in turn (rotating which goes
// first) per sample, n samples or until more says stop (checked before
// each), numbering them from *next on.
func sampleWhile(ctx context.Context, next *int, n int, pace time.Duration, more func() bool, rts ...roundTrip) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(rts))
	for s := 0; s < n && (more == nil || more()); s++ {
		i := *next
		*next++
		for j := range rts {
			k := (i + j) % len(rts)
			if pace > 0 {
				time.Sleep(pace)
			}
			d, err := rts[k].once(ctx, i)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", rts[k].name, err)
			}
			out[k] = append(out[k], d)
		}
	}
	return out, nil
}

// requestReply is core request/reply with a responder on its own
// connection, one request in flight.
func requestReply(e *env, client *bus.Conn, size int) (*probe, error) {
	resp, err := e.connect("bench-responder")
	if err != nil {
		return nil, err
	}
	sub, err := resp.NC.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		return nil, err
	}
	if err := resp.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	payload := make([]byte, size)
	return &probe{
		roundTrip: roundTrip{name: "request/reply", once: func(ctx context.Context, _ int) (time.Duration, error) {
			t0 := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := client.NC.RequestWithContext(rctx, "bench.echo", payload); err != nil {
				return 0, err
			}
			return time.Since(t0), nil
		}},
		close: func() { _ = sub.Unsubscribe() },
	}, nil
}

// watchAcks copies the acks sent for a consumer's messages: they are core
// publishes to $JS.ACK.<stream>.<consumer>.…, which any subscriber also
// receives. One command is in flight, so the next "+ACK" is its.
func watchAcks(c *bus.Conn, stream, consumer string) (<-chan struct{}, func(), error) {
	acked := make(chan struct{}, 1)
	sub, err := c.NC.Subscribe("$JS.ACK."+stream+"."+consumer+".>", func(m *nats.Msg) {
		if len(m.Data) == 0 || string(m.Data) == "+ACK" {
			select {
			case acked <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	if err := c.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, nil, err
	}
	return acked, func() { _ = sub.Unsubscribe() }, nil
}

func waitAck(ctx context.Context, acked <-chan struct{}, op string) error {
	select {
	case <-acked:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: receipt seen but no ack in 10s", op)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// consumerState describes a consumer for an error: where a command stuck.
func consumerState(ctx context.Context, c *bus.Conn, stream, name string) string {
	cons, err := c.JS.Consumer(ctx, stream, name)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	return fmt.Sprintf("consumer %s: pending %d, ack pending %d, redelivered %d, waiting pulls %d, delivered seq %d, ack floor %d",
		name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered.Stream, ci.AckFloor.Stream)
}
