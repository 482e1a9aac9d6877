package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

func rttCommand(nodeID string, enr schemas.Enrollment, op, digest string) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: nodeID, FencingToken: enr.FencingToken, Generation: enr.Generation,
		Kind: schemas.CmdPrepareImage, IssuedAt: time.Now(),
		PrepareImage: &schemas.PrepareImage{Reference: "localhost/bench@" + digest, ManifestDigest: digest, Unpack: true},
	}
}

// rttStop is a stop for an attempt this node never launched: its journal
// entry is synced before the ack (syncBeforeAck), and the agent reports the
// attempt failed before the receipt, one more publish-with-ack than a
// prepare makes.
func rttStop(nodeID string, enr schemas.Enrollment, op string) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: nodeID, FencingToken: enr.FencingToken, Generation: enr.Generation,
		Kind: schemas.CmdStopWorkload, IssuedAt: time.Now(),
		Stop: &schemas.StopWorkload{AttemptID: op + "-a1", Reason: "bench"},
	}
}

// receipt is a command's receipt: when this process saw it, and when the
// agent says it accepted the command.
type receipt struct {
	seen, acceptedAt time.Time
}

// receipts hands each receipt a node publishes to the round trip waiting
// for its operation.
type receipts struct {
	mu      sync.Mutex
	waiting map[string]chan receipt
}

func (r *receipts) deliver(m *nats.Msg) {
	now := time.Now()
	var o schemas.Observation
	if codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &o) != nil || o.Receipt == nil {
		return
	}
	r.mu.Lock()
	ch := r.waiting[o.Receipt.OperationID]
	delete(r.waiting, o.Receipt.OperationID)
	r.mu.Unlock()
	if ch != nil {
		ch <- receipt{now, o.Receipt.AcceptedAt}
	}
}

func (r *receipts) expect(op string) <-chan receipt {
	ch := make(chan receipt, 1)
	r.mu.Lock()
	r.waiting[op] = ch
	r.mu.Unlock()
	return ch
}

// commandProbe publishes commands as dispatch does and times each receipt:
// roundTrip sends prepares, stops sends stops (rttStop).
type commandProbe struct {
	probe
	stops roundTrip
	// deliver is publish → the agent's AcceptedAt (same machine clock), one
	// per prepare round trip, warm-up included.
	deliver []time.Duration

	client   *bus.Conn
	nodeID   string
	receipts *receipts
	acked    <-chan struct{}
}

func commandRTT(client *bus.Conn, nodeID string, enr schemas.Enrollment, digest string) (*commandProbe, error) {
	rs := &receipts{waiting: map[string]chan receipt{}}
	sub, err := client.NC.Subscribe(bus.NodeObs(nodeID), rs.deliver)
	if err != nil {
		return nil, err
	}
	acked, stopAcks, err := watchAcks(client, bus.StreamCmds, bus.NodeConsumer(nodeID))
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	p := &commandProbe{client: client, nodeID: nodeID, receipts: rs, acked: acked}
	p.close = func() { _ = sub.Unsubscribe(); stopAcks() }
	p.roundTrip = roundTrip{name: "command", once: func(ctx context.Context, i int) (time.Duration, error) {
		op := fmt.Sprintf("bench-rtt-%s-%06d", nonce, i)
		return p.trip(ctx, op, rttCommand(nodeID, enr, op, digest), &p.deliver)
	}}
	p.stops = roundTrip{name: "stop command", once: func(ctx context.Context, i int) (time.Duration, error) {
		op := fmt.Sprintf("bench-rtt-stop-%s-%06d", nonce, i)
		return p.trip(ctx, op, rttStop(nodeID, enr, op), nil)
	}}
	return p, nil
}

// trip publishes c into WF_CMDS and times until its receipt is seen; the
// agent's AcceptedAt goes to deliver, when given.
func (p *commandProbe) trip(ctx context.Context, op string, c schemas.Command, deliver *[]time.Duration) (time.Duration, error) {
	b, err := codec.Encode(codec.MsgPack, c)
	if err != nil {
		return 0, err
	}
	ch := p.receipts.expect(op)
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = p.client.JS.PublishMsg(pctx, &nats.Msg{Subject: bus.NodeCmd(p.nodeID), Data: b},
		jetstream.WithMsgID(op+":"+strconv.FormatUint(c.FencingToken, 10)))
	cancel()
	if err != nil {
		return 0, fmt.Errorf("publish command: %w", err)
	}
	select {
	case r := <-ch:
		if deliver != nil {
			*deliver = append(*deliver, r.acceptedAt.Sub(t0))
		}
		// Untimed: the agent's ack (after the journal sync, for a stop)
		// ends the command's work, so the next probe starts on a settled
		// machine.
		return r.seen.Sub(t0), waitAck(ctx, p.acked, op)
	case <-time.After(10 * time.Second):
		return 0, fmt.Errorf("no receipt for %s in 10s (%s)", op, consumerState(ctx, p.client, bus.StreamCmds, bus.NodeConsumer(p.nodeID)))
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
