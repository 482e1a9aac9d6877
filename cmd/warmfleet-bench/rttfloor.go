package main

import (
	"context"
	"fmt"
	"os"
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
	var cleanup undo
	cmds, obs, durable, err := floorResponder(ctx, e, client, &cleanup)
	if err != nil {
		cleanup.run()
		return nil, err
	}
	seen := make(chan string, 1)
	sub, err := client.NC.Subscribe(obs, func(m *nats.Msg) {
		select {
		case seen <- m.Header.Get("Bench-Op"):
		default:
		}
	})
	if err != nil {
		cleanup.run()
		return nil, err
	}
	cleanup.push(func() { _ = sub.Unsubscribe() })
	acked, stopAcks, err := watchAcks(client, floorCmdStream, durable)
	if err != nil {
		cleanup.run()
		return nil, err
	}
	cleanup.push(stopAcks)
	payload := make([]byte, size)
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	// The floor runs in more than one pass: its ids count across them, or
	// the stream's dedupe would drop a second pass's publishes.
	sent := 0
	return &probe{close: cleanup.run, roundTrip: roundTrip{name: "command floor", once: func(ctx context.Context, _ int) (time.Duration, error) {
		op := fmt.Sprintf("floor-%s-%06d", nonce, sent)
		sent++
		t0 := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := client.JS.PublishMsg(pctx, &nats.Msg{Subject: cmds, Data: payload}, jetstream.WithMsgID(op))
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

// The floor's streams, configured as WF_CMDS and WF_OBS.
const (
	floorCmdStream = "BENCH_CMDFLOOR"
	floorObsStream = "BENCH_OBSFLOOR"
)

// floorResponder makes the floor's streams and the responder that plays
// the agent: for each command on the consumer (durable, configured as a
// node's), a receipt published with ack, then the command's ack. It
// returns the command and receipt subjects; what it started is on cleanup.
func floorResponder(ctx context.Context, e *env, client *bus.Conn, cleanup *undo) (cmdSubj, obsSubj, durable string, err error) {
	resp, err := e.connect("floor-agent")
	if err != nil {
		return "", "", "", err
	}
	cmds, obs := streamConfig(bus.StreamCmds), streamConfig(bus.StreamObs)
	cmds.Name, cmds.Subjects, cmds.Description = floorCmdStream, []string{"bench.cmdfloor.cmd"}, ""
	obs.Name, obs.Subjects, obs.Description = floorObsStream, []string{"bench.cmdfloor.obs"}, ""
	for _, c := range []jetstream.StreamConfig{cmds, obs} {
		if _, err := client.JS.CreateStream(ctx, c); err != nil {
			return "", "", "", fmt.Errorf("command floor: create %s: %w", c.Name, err)
		}
	}
	cleanup.push(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.JS.DeleteStream(dctx, cmds.Name)
		_ = client.JS.DeleteStream(dctx, obs.Name)
	})
	cc := bus.NodeConsumerConfig("bench-floor", 0)
	cc.FilterSubject = cmds.Subjects[0]
	cons, err := resp.JS.CreateOrUpdateConsumer(ctx, cmds.Name, cc)
	if err != nil {
		return "", "", "", fmt.Errorf("command floor: consumer: %w", err)
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
		return "", "", "", fmt.Errorf("command floor: consume: %w", err)
	}
	cleanup.push(consumeCtx.Stop)
	return cmds.Subjects[0], obs.Subjects[0], cc.Durable, nil
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

// fsyncFloor times what the agent's journal does per command, in the same
// filesystem: append one line and fsync.
func fsyncFloor(path string, warmup, samples int) ([]time.Duration, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(path) }()
	line := []byte(`{"operation_id":"bench-rtt-0000000000000-000000","kind":"prepare_image","outcome":"applied","applied_at":"2026-01-01T00:00:00Z"}` + "\n")
	out := make([]time.Duration, 0, samples)
	for i := range warmup + samples {
		t0 := time.Now()
		if _, err := f.Write(line); err != nil {
			return nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
		if i >= warmup {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}
