package output

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/nodelog"
)

// window is how many chunks of one attempt are in flight at once.
const window = 16

// errConnClosed: the log connection closed for good (nats.go gives up
// reconnecting once the login is refused, as when the session it was
// granted for ends); the shipment dials a new one.
var errConnClosed = errors.New("log connection closed")

// run ships until both streams are stored to their end, ctx ends, or the
// directory is removed; a log connection that closes is dialed again.
func (sh *Shipment) run(ctx context.Context) error {
	for {
		err := sh.ship(ctx)
		if !errors.Is(err, errConnClosed) || sh.ownConn() {
			return err // the node's own connection closes only with the agent
		}
		sh.s.cfg.Log.Info("log connection closed; dialing again", zap.String("workload", sh.meta.AttemptID))
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// ship ships on one log connection.
func (sh *Shipment) ship(ctx context.Context) error {
	js, closeJS, err := sh.dial(ctx)
	if err != nil {
		return err
	}
	defer closeJS()
	p, err := openPump(sh, js)
	if err != nil {
		return err
	}
	defer p.close()
	defer sh.s.behind.forget(sh.meta.AttemptID)
	backoff := 250 * time.Millisecond
	for {
		if nc := js.Conn(); nc != nil && nc.IsClosed() {
			return errConnClosed
		}
		// Once the writer is done (or gone) the files are whole: a last
		// line without its newline ships as it is, and streams close.
		final := nodelog.Done(sh.dir) || sh.closed()
		if err := p.send(final); err != nil {
			return err
		}
		// A full window means more may be ready: read again at once.
		busy := len(p.queue) == window
		stored, err := p.settle(ctx)
		if err != nil {
			return err
		}
		if !stored {
			if !sleepCtx(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 250 * time.Millisecond
		if ended, err := p.end(ctx, final); err != nil || ended {
			return err
		}
		if busy {
			continue
		}
		wake := sh.final
		if final {
			wake = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-time.After(sh.s.cfg.Poll):
		}
	}
}

// pump moves one directory's streams to JetStream: chunks sent in order
// through a window, acknowledgements read in the order sent, each span
// journaled before it is sent and its acknowledgement after.
type pump struct {
	sh     *Shipment
	js     jetstream.JetStream
	j      *nodelog.Journal
	state  [2]nodelog.StreamState
	tails  [2]*nodelog.Tail
	resend [2][]nodelog.Span // spans owed again, in order
	queue  []inflight        // sent, not yet acknowledged
}

// inflight is one chunk sent and not yet acknowledged.
type inflight struct {
	span    nodelog.Span
	stream  nodelog.Stream
	at      time.Time
	dropped int64
	ack     jetstream.PubAckFuture
}

// openPump resumes from what the directory's journal says was sent and
// acknowledged.
func openPump(sh *Shipment, js jetstream.JetStream) (*pump, error) {
	j, state, err := nodelog.OpenJournal(sh.dir)
	if err != nil {
		return nil, err
	}
	p := &pump{sh: sh, js: js, j: j, state: state}
	for _, s := range nodelog.Streams {
		p.tails[s] = nodelog.NewTail(sh.dir, s, state[s].Next)
		p.resend[s] = state[s].Unacked
	}
	return p, nil
}

func (p *pump) close() {
	for _, t := range p.tails {
		_ = t.Close()
	}
	_ = p.j.Close()
}

// send fills the window: for each stream, spans owed again first, then new
// chunks.
func (p *pump) send(final bool) error {
	for _, s := range nodelog.Streams {
		if err := p.sendStream(s, final); err != nil {
			return err
		}
	}
	return nil
}

func (p *pump) sendStream(s nodelog.Stream, final bool) error {
	for !p.state[s].Ended && len(p.queue) < window {
		var c nodelog.Chunk
		var err error
		if len(p.resend[s]) > 0 {
			if c, err = p.tails[s].At(p.resend[s][0], nil); err != nil {
				return err
			}
			p.resend[s] = p.resend[s][1:]
		} else {
			var ok bool
			if c, ok, err = p.tails[s].Next(bus.MaxLogChunk, final, p.sh.s.cfg.Now()); err != nil || !ok {
				return err
			}
			if err := p.j.Intent(s, nodelog.Span{Start: c.Offset, End: c.End()}); err != nil {
				return err
			}
		}
		span := nodelog.Span{Start: c.Offset, End: c.End()}
		f, err := p.js.PublishMsgAsync(p.sh.chunkMsg(c), jetstream.WithMsgID(bus.LogMsgID(p.sh.meta.AttemptID, s.String(), c.Offset)))
		if err != nil {
			p.resend[s] = append([]nodelog.Span{span}, p.resend[s]...)
			return nil
		}
		p.queue = append(p.queue, inflight{span: span, stream: s, at: c.At, dropped: c.Dropped, ack: f})
	}
	return nil
}

// settle reads the acknowledgements in the order sent, journaling each.
// At a failed one, it and everything after it are owed again, in order
// (what was stored after all is dropped by JetStream's dedupe), and
// stored is false.
func (p *pump) settle(ctx context.Context) (stored bool, err error) {
	cfg := &p.sh.s.cfg
	for len(p.queue) > 0 {
		head := p.queue[0]
		select {
		case <-head.ack.Ok():
		case err := <-head.ack.Err():
			cfg.Log.Debug("log chunk not stored; resending", zap.String("workload", p.sh.meta.AttemptID), zap.Error(err))
			for i := len(p.queue) - 1; i >= 0; i-- {
				q := p.queue[i]
				p.resend[q.stream] = append([]nodelog.Span{q.span}, p.resend[q.stream]...)
			}
			p.queue = p.queue[:0]
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if err := p.j.Acked(head.stream, head.span.End); err != nil {
			return false, err
		}
		p.state[head.stream].Acked = head.span.End
		if m := cfg.Metrics; m != nil {
			m.Shipped(head.stream.String(), head.span.End-head.span.Start, head.dropped, cfg.Now().Sub(head.at))
		}
		p.queue = p.queue[1:]
	}
	return true, nil
}

// end closes each stream once its writer is done (final) and every byte
// is stored, and says whether both are closed.
func (p *pump) end(ctx context.Context, final bool) (ended bool, err error) {
	n := 0
	for _, s := range nodelog.Streams {
		if p.state[s].Ended {
			n++
			continue
		}
		size, err := nodelog.Size(p.sh.dir, s)
		if err != nil {
			return false, err
		}
		p.sh.s.behind.set(p.sh.meta.AttemptID, s, size-p.state[s].Acked)
		if !final || len(p.resend[s]) > 0 || p.state[s].Acked < size {
			continue
		}
		if err := p.sh.publishEnd(ctx, p.js, s, size); err != nil {
			p.sh.s.cfg.Log.Debug("log end not stored; retrying", zap.String("workload", p.sh.meta.AttemptID), zap.Error(err))
			continue
		}
		if err := p.j.Ended(s, size); err != nil {
			return false, err
		}
		p.state[s].Ended = true
		n++
	}
	return n == len(nodelog.Streams), nil
}

func (sh *Shipment) chunkMsg(c nodelog.Chunk) *nats.Msg {
	return bus.LogChunkMsg(sh.meta.Subject, sh.meta.AttemptID, c.Stream.String(), sh.s.cfg.NodeID, c.Offset, c.At, c.Data)
}

func (sh *Shipment) publishEnd(ctx context.Context, js jetstream.JetStream, s nodelog.Stream, size int64) error {
	m := bus.LogEndMsg(sh.meta.Subject, sh.meta.AttemptID, s.String(), sh.s.cfg.NodeID, size)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(bus.LogEndMsgID(sh.meta.AttemptID, s.String())))
	return err
}
