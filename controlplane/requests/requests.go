// Package requests is the control plane's one server of request/reply
// subjects: a request decoded (JSON or msgpack, strictly), validated,
// refused with its code or answered, and the reply sent in the request's
// encoding, in the replicas' queue group, by a pool of workers.
package requests

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/schemas"
)

// Workers is how many requests of one subject a replica answers at once
// unless its server says otherwise: enough that a slow answer (a KV
// write, a node's reply, a credential helper) holds up no other request.
const Workers = 16

// DefaultPool is Workers at once, four times as many waiting.
func DefaultPool() keyed.PoolOptions { return keyed.PoolOptions{Workers: Workers, Queue: Workers * 4} }

// Server answers one subject with replies of type Rep to requests of type
// T.
type Server[T, Rep any] struct {
	// Subject is the subject served; a wildcard serves one per node.
	Subject string
	// What names the request in the log of a refused one ("<What>
	// refused"); "request" when empty.
	What string
	// Malformed is the refusal's reason for a body that is not a T, e.g.
	// "body is not an InviteRequest".
	Malformed string
	// Validate checks a decoded request; nil accepts any that decodes.
	Validate func(*T) error
	// Answer decides a valid request that came on subject.
	Answer func(ctx context.Context, subject string, req T) Rep
	// Refuse is the reply to a request that did not decode (err wraps
	// codec.ErrMalformed) or did not validate; r is the input's coded
	// refusal (schemas.RefusalOfInput with Malformed). Refusal is the
	// Refuse of a server whose replies are schemas.Reply.
	Refuse func(r *schemas.Refusal, err error) Rep
	// Pool bounds the requests answered at once and those waiting; the
	// zero value gives each request a goroutine of its own.
	Pool keyed.PoolOptions
	// JSON sends every reply in JSON, whatever the request's encoding.
	JSON bool
	// Empty takes an empty body as the zero request (not validated),
	// answered in JSON; otherwise it is refused as malformed.
	Empty bool
	// Refused counts requests refused here; may be nil.
	Refused *atomic.Int64
	Log     *zap.Logger
}

// Coded is a server whose replies are schemas.Reply[R]: answer's result,
// or its error as a coded refusal (schemas.AsRefusal); a body that does not
// decode or validate is refused with schemas.RefusalOfInput(err,
// malformed). It answers with DefaultPool.
func Coded[T, R any](subject, malformed string, validate func(*T) error, answer func(ctx context.Context, subject string, req T) (R, error), log *zap.Logger) *Server[T, schemas.Reply[R]] {
	return &Server[T, schemas.Reply[R]]{
		Subject: subject, Malformed: malformed, Validate: validate, Pool: DefaultPool(), Log: log,
		Answer: func(ctx context.Context, subject string, req T) schemas.Reply[R] {
			return Reply(answer(ctx, subject, req))
		},
		Refuse: Refusal[R],
	}
}

// Refusal is the reply to a request refused as input: the refusal alone.
func Refusal[R any](r *schemas.Refusal, _ error) schemas.Reply[R] {
	return schemas.Reply[R]{Refusal: r}
}

// Reply is r as a schemas.Reply, or err as its coded refusal.
func Reply[R any](r R, err error) schemas.Reply[R] {
	if err != nil {
		return schemas.Reply[R]{Refusal: schemas.AsRefusal(err)}
	}
	return schemas.Reply[R]{OK: &r}
}

// Handle decodes, validates and answers one request.
func (s *Server[T, Rep]) Handle(ctx context.Context, m *nats.Msg) {
	req, enc, err := s.decode(m)
	var rep Rep
	if err != nil {
		// The input's refusal, never the input: a body may hold a secret.
		r := schemas.RefusalOfInput(err, s.Malformed)
		rep = s.Refuse(r, err)
		if s.Refused != nil {
			s.Refused.Add(1)
		}
		what := s.What
		if what == "" {
			what = "request"
		}
		s.Log.Info(what+" refused", zap.String("subject", m.Subject), zap.String("code", string(r.Code)), zap.String("reason", r.Reason))
	} else {
		rep = s.Answer(ctx, m.Subject, req)
	}
	if s.JSON {
		enc = codec.JSON
	}
	if err := bus.Respond(m, enc, rep); err != nil {
		s.Log.Error("reply", zap.String("subject", m.Subject), zap.Error(err))
	}
}

// decode reads a request and checks it; enc is the encoding to answer in.
func (s *Server[T, Rep]) decode(m *nats.Msg) (req T, enc codec.Encoding, err error) {
	if s.Empty && len(m.Data) == 0 {
		return req, codec.JSON, nil
	}
	// Bounded before decoding, whatever the server's max_payload.
	if err := schemas.CheckNodeMessageSize(len(m.Data)); err != nil {
		return req, codec.Detect(m.Header, m.Data), err
	}
	if enc, err = codec.DecodeMsg(m, &req); err == nil && s.Validate != nil {
		err = s.Validate(&req)
	}
	return req, enc, err
}

// Endpoint is a server ready to subscribe: what Serve takes.
type Endpoint interface {
	subject() string
	handler(ctx context.Context, wg *sync.WaitGroup) nats.MsgHandler
}

func (s *Server[T, Rep]) subject() string { return s.Subject }

// handler hands each request to a pool of workers that wg owns and ctx
// stops, keyed by reply inbox only to spread the load.
func (s *Server[T, Rep]) handler(ctx context.Context, wg *sync.WaitGroup) nats.MsgHandler {
	pool := keyed.NewPool(ctx, wg, s.Pool, s.Handle)
	return func(m *nats.Msg) { pool.Submit(m.Reply, m) }
}

// Serve subscribes every endpoint in the control plane's queue group
// (bus.QueueSubscribeAll) until ctx ends or stop is called. The workers
// are owned by wg.
func Serve(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn, endpoints ...Endpoint) (stop func(), err error) {
	handlers := make(map[string]nats.MsgHandler, len(endpoints))
	for _, e := range endpoints {
		handlers[e.subject()] = e.handler(ctx, wg)
	}
	subs, err := bus.QueueSubscribeAll(nc, handlers)
	if err != nil {
		return nil, err
	}
	return subs.Stop, nil
}
