package residency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
)

// ErrNoWork is Inbox.Next's answer when nothing arrived within the wait.
var ErrNoWork = errors.New("residency: no inbox work")

// ErrWorkUnfinished is a handler's answer when consumption stopped before
// the session's runtime finished the work: the message goes back to the
// inbox at once, for this host's next grant or the next holder.
var ErrWorkUnfinished = errors.New("residency: inbox work unfinished")

// Work is one inbox message handed to the resident host's Handler.
type Work struct {
	Key       Key
	Subject   string
	MsgID     string
	Data      []byte
	Delivered uint64
	// Guard is the fence of the grant the work was delivered under. A
	// handler checks it before every effect and stamps Guard.Epoch() on
	// what it writes; a refusal must be returned (it wraps ErrStaleEpoch),
	// so the message goes back to the inbox for the next holder.
	Guard Guard
	// Stopping is closed once consumption stops (a release or drain halts
	// it). A handler waiting on the session's runtime returns an error
	// wrapping ErrWorkUnfinished then, rather than holding the release.
	Stopping <-chan struct{}
	// InProgress tells the inbox the work is still going on, so it is not
	// redelivered after the consumer's AckWait. A handler that waits calls
	// it well within AckWait.
	InProgress func() error
}

// Handler handles one message. nil acks it (after the handler returned, so
// work is never acked before it is done); an error wrapping ErrStaleEpoch
// hands it back at once and stops consumption; one wrapping
// ErrWorkUnfinished hands it back at once; Permanent(err) terminates it;
// any other error redelivers it after a delay.
//
// A Handler must not call Release or Drain of its own Manager for its own
// session: a release waits for the handler in flight.
type Handler func(ctx context.Context, w Work) error

type permanentError struct{ err error }

func (p permanentError) Error() string { return "permanent: " + p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks a handler error as final: the message is terminated, not
// redelivered.
func Permanent(err error) error { return permanentError{err} }

// Inboxes opens a session's durable inbox.
type Inboxes interface {
	OpenInbox(ctx context.Context, key Key) (Inbox, error)
}

// Inbox is one session's durable inbox, as its resident host sees it.
type Inbox interface {
	// Next waits up to wait for one message; ErrNoWork if none came.
	Next(ctx context.Context, wait time.Duration) (Delivery, error)
	// AcceptedWork reports whether the inbox holds work accepted for the
	// session and not yet terminal (pending or taken and not yet acked).
	AcceptedWork(ctx context.Context) (bool, error)
}

// Delivery is one message taken from an Inbox.
type Delivery interface {
	Subject() string
	MsgID() string
	Data() []byte
	Delivered() uint64
	// Ack confirms the message done; it returns once the server holds it.
	Ack(ctx context.Context) error
	// InProgress resets the message's AckWait.
	InProgress() error
	// Nak hands the message back for redelivery after delay.
	Nak(delay time.Duration) error
	// Term ends the message without redelivery.
	Term() error
}

// JetStreamInboxes binds each session's durable consumer on WF_INBOX. It
// never creates a consumer (the control plane does, with the lease: see
// KVLeases), so it needs only the pull and ack rights an agent has.
type JetStreamInboxes struct {
	JS jetstream.JetStream
}

var _ Inboxes = JetStreamInboxes{}

// OpenInbox implements Inboxes.
func (j JetStreamInboxes) OpenInbox(ctx context.Context, key Key) (Inbox, error) {
	c, err := j.JS.Consumer(ctx, bus.StreamInbox, bus.InboxConsumer(key.Tenant, key.Session))
	if err != nil {
		return nil, fmt.Errorf("residency: bind inbox of %s: %w", key, err)
	}
	return jsInbox{c: c}, nil
}

type jsInbox struct{ c jetstream.Consumer }

func (i jsInbox) Next(ctx context.Context, wait time.Duration) (Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m, err := i.c.Next(jetstream.FetchMaxWait(wait))
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
		return nil, ErrNoWork
	}
	if err != nil {
		return nil, err
	}
	return jsDelivery{m}, nil
}

func (i jsInbox) AcceptedWork(ctx context.Context) (bool, error) {
	info, err := i.c.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending > 0 || info.NumAckPending > 0, nil
}

type jsDelivery struct{ m jetstream.Msg }

func (d jsDelivery) Subject() string { return d.m.Subject() }
func (d jsDelivery) MsgID() string   { return d.m.Headers().Get(jetstream.MsgIDHeader) }
func (d jsDelivery) Data() []byte    { return d.m.Data() }
func (d jsDelivery) Delivered() uint64 {
	if md, err := d.m.Metadata(); err == nil {
		return md.NumDelivered
	}
	return 0
}
func (d jsDelivery) Ack(ctx context.Context) error { return d.m.DoubleAck(ctx) }
func (d jsDelivery) InProgress() error             { return d.m.InProgress() }
func (d jsDelivery) Nak(delay time.Duration) error {
	if delay <= 0 {
		return d.m.Nak()
	}
	return d.m.NakWithDelay(delay)
}
func (d jsDelivery) Term() error { return d.m.Term() }

// consumer pulls one session's inbox while its grant is held. Only one
// runs per residency; halt stops it between messages and waits for the one
// in flight, abort also cancels the handler.
type consumer struct {
	key     Key
	inbox   Inbox
	fence   *fence
	handler Handler
	wait    time.Duration
	retry   time.Duration
	log     *zap.Logger
	hooks   Hooks

	// activity counts messages taken; busy is set while one is handled.
	// The warm countdown reads both.
	activity atomic.Uint64
	busy     atomic.Bool
	onWork   func()
	onIdle   func()

	mu       sync.Mutex
	running  bool
	stop     chan struct{}
	done     chan struct{}
	hctx     context.Context
	hcancel  context.CancelFunc
	spawn    func(func()) bool // runs a goroutine the Manager owns
	baseCtx  context.Context
	stopOnce *sync.Once
}

func (c *consumer) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return
	}
	c.running = true
	c.stop = make(chan struct{})
	c.done = make(chan struct{})
	c.stopOnce = &sync.Once{}
	c.hctx, c.hcancel = context.WithCancel(c.baseCtx)
	stop, done, hctx := c.stop, c.done, c.hctx
	if !c.spawn(func() { c.loop(hctx, stop, done) }) {
		close(done) // the Manager is closed
	}
}

// resume undoes halt, for a release that aborts. A halt that timed out
// left the loop finishing its message; consumption restarts once it has.
func (c *consumer) resume() {
	c.mu.Lock()
	running, stop, done := c.running, c.stop, c.done
	c.mu.Unlock()
	if running {
		select {
		case <-stop:
		default:
			return // never halted
		}
		c.spawn(func() {
			<-done
			c.mu.Lock()
			c.running = false
			c.hcancel()
			c.mu.Unlock()
			c.start()
		})
		return
	}
	c.start()
}

// halt stops consumption after the message in flight and waits, bounded by
// ctx, for it.
func (c *consumer) halt(ctx context.Context) error {
	c.mu.Lock()
	if !c.running {
		c.mu.Unlock()
		return nil
	}
	stop, done, once := c.stop, c.done, c.stopOnce
	c.mu.Unlock()
	once.Do(func() { close(stop) })
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("residency: halt consumption of %s: %w", c.key, ctx.Err())
	}
	c.mu.Lock()
	c.running = false
	c.hcancel()
	c.mu.Unlock()
	return nil
}

// abort stops consumption now: the handler's context is cancelled.
func (c *consumer) abort() {
	c.mu.Lock()
	if !c.running {
		c.mu.Unlock()
		return
	}
	stop, done, once, cancel := c.stop, c.done, c.stopOnce, c.hcancel
	c.mu.Unlock()
	once.Do(func() { close(stop) })
	cancel()
	<-done
	c.mu.Lock()
	c.running = false
	c.mu.Unlock()
}

func (c *consumer) loop(ctx context.Context, stop, done chan struct{}) {
	defer close(done)
	epoch := c.fence.Epoch()
	c.hooks.consuming(c.key, epoch, true)
	defer c.hooks.consuming(c.key, epoch, false)
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for !stopped() {
		if err := c.fence.Check(); err != nil {
			c.log.Info("inbox consumption stops: grant gone", zap.Error(err))
			return
		}
		d, err := c.inbox.Next(ctx, c.wait)
		if errors.Is(err, ErrNoWork) {
			c.onIdle()
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("inbox fetch failed", zap.Error(err))
			select {
			case <-stop:
			case <-time.After(c.wait):
			}
			continue
		}
		c.activity.Add(1)
		c.onWork()
		c.handle(ctx, stop, d)
	}
}

// handle runs one message under the fence and settles it.
func (c *consumer) handle(ctx context.Context, stop chan struct{}, d Delivery) {
	c.busy.Store(true)
	defer c.busy.Store(false)
	log := c.log.With(zap.String("msg_id", d.MsgID()), zap.Uint64("delivered", d.Delivered()))
	select {
	case <-stop:
		// Taken while halting: back to the inbox for whoever is next.
		c.nak(log, d, 0)
		return
	default:
	}
	if err := c.fence.Check(); err != nil {
		c.nak(log, d, 0)
		return
	}
	err := c.handler(ctx, Work{
		Key: c.key, Subject: d.Subject(), MsgID: d.MsgID(), Data: d.Data(), Delivered: d.Delivered(), Guard: c.fence,
		Stopping: stop, InProgress: d.InProgress,
	})
	var perm permanentError
	switch {
	case err == nil:
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if aerr := d.Ack(actx); aerr != nil {
			log.Warn("ack failed; the message will be redelivered after AckWait", zap.Error(aerr))
		}
	case errors.Is(err, ErrStaleEpoch):
		log.Info("handler refused under a stale epoch; handing the message back", zap.Error(err))
		c.nak(log, d, 0)
	case errors.Is(err, ErrWorkUnfinished):
		log.Info("consumption stopped before the work finished; handing the message back", zap.Error(err))
		c.nak(log, d, 0)
	case errors.As(err, &perm):
		log.Warn("handler failed permanently; terminating the message", zap.Error(err))
		if terr := d.Term(); terr != nil {
			log.Warn("term failed", zap.Error(terr))
		}
	default:
		log.Warn("handler failed; redelivering", zap.Error(err))
		c.nak(log, d, c.retry)
	}
}

func (c *consumer) nak(log *zap.Logger, d Delivery, delay time.Duration) {
	if err := d.Nak(delay); err != nil {
		log.Warn("nak failed; the message will be redelivered after AckWait", zap.Error(err))
	}
}
