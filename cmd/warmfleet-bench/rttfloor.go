package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// commandFloor measures the least a command round trip costs on this server
// when the command and its receipt both travel through
// JetStream, with no warmfleet code: the client publishes with ack into a
// work-queue stream configured as WF_CMDS, a responder on its own
// connection takes it from a durable pull consumer configured as a node's
// (the same Consume call the agent makes), publishes a receipt with ack into
// a work-queue stream configured as WF_OBS, and acks the command; the client
// times publish → receipt seen on a core subscription, as commandRTT does.
// No decode, fencing, journal or runtime call. The command round trip over
// this floor is what the agent adds; this floor over request/reply is what
// two JetStream hops cost instead of two core ones.
func commandFloor(ctx context.Context, e *env, client *bus.Conn, size int) (*probe, error) {
	resp, err := e.connect("floor-agent")
	if err != nil {
		return nil, err
	}
	cmds, obs := streamConfig(bus.StreamCmds), streamConfig(bus.StreamObs)
	cmds.Name, cmds.Subjects, cmds.Description = "BENCH_CMDFLOOR", []string{"bench.cmdfloor.cmd"}, ""
	obs.Name, obs.Subjects, obs.Description = "BENCH_OBSFLOOR", []string{"bench.cmdfloor.obs"}, ""
	for _, c := range []jetstream.StreamConfig{cmds, obs} {
		if _, err := client.JS.CreateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("command floor: create %s: %w", c.Name, err)
		}
	}
	var stops []func()
	closeAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.JS.DeleteStream(dctx, cmds.Name)
		_ = client.JS.DeleteStream(dctx, obs.Name)
	})
	cc := bus.NodeConsumerConfig("bench-floor", 0)
	cc.FilterSubject = cmds.Subjects[0]
	cons, err := resp.JS.CreateOrUpdateConsumer(ctx, cmds.Name, cc)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("command floor: consumer: %w", err)
	}
	receipt := make([]byte, 200) // about a receipt observation's size
	consumeCtx, err := cons.Consume(func(m jetstream.Msg) {
		id := m.Headers().Get(nats.MsgIdHdr)
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := resp.JS.PublishMsg(pctx, &nats.Msg{Subject: obs.Subjects[0], Data: receipt, Header: nats.Header{"Bench-Op": {id}}},
			jetstream.WithMsgID("r:"+id))
		cancel()
		if err == nil {
			_ = m.Ack()
		}
	})
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("command floor: consume: %w", err)
	}
	stops = append(stops, consumeCtx.Stop)

	seen := make(chan string, 1)
	sub, err := client.NC.Subscribe(obs.Subjects[0], func(m *nats.Msg) {
		select {
		case seen <- m.Header.Get("Bench-Op"):
		default:
		}
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	stops = append(stops, func() { _ = sub.Unsubscribe() })
	acked, stopAcks, err := watchAcks(client, cmds.Name, cc.Durable)
	if err != nil {
		closeAll()
		return nil, err
	}
	stops = append(stops, stopAcks)
	payload := make([]byte, size)
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	// The floor runs in more than one pass: its ids count across them, or
	// the stream's dedupe would drop a second pass's publishes.
	sent := 0
	return &probe{close: closeAll, roundTrip: roundTrip{name: "command floor", once: func(ctx context.Context, _ int) (time.Duration, error) {
		op := fmt.Sprintf("floor-%s-%06d", nonce, sent)
		sent++
		t0 := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := client.JS.PublishMsg(pctx, &nats.Msg{Subject: cmds.Subjects[0], Data: payload}, jetstream.WithMsgID(op))
		cancel()
		if err != nil {
			return 0, fmt.Errorf("publish: %w", err)
		}
		for {
			select {
			case got := <-seen:
				if got == op {
					return time.Since(t0), waitAck(ctx, acked, op)
				}
			case <-time.After(10 * time.Second):
				return 0, fmt.Errorf("no receipt for %s in 10s", op)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	}}}, nil
}

// streamConfig is the provisioned configuration of one of warmfleet's streams.
func streamConfig(name string) jetstream.StreamConfig {
	for _, c := range (bus.Topology{}).StreamConfigs() {
		if c.Name == name {
			return c
		}
	}
	panic("bench: no stream " + name)
}
