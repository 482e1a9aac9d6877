// Package fakeexec is an ephemeral.Executor in memory, for tests: a
// standing pool per offer whose executions queue, run and end on the
// wall clock, with the faults real executors have (a launch applied whose
// answer is lost, a pool that holds work queued, an execution that fails).
package fakeexec

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// Type is the adapter type string.
const Type = "fake-ephemeral"

// Config shapes the pool.
type Config struct {
	Offers []ephemeral.Offer
	// QueueFor and RunFor are how long an execution waits, then runs.
	QueueFor, RunFor time.Duration
	// RejectCredentials fails every call unauthorized.
	RejectCredentials bool
	// IgnoreTimeout is a provider that does not enforce the execution
	// timeout it is given: only a release ends a long execution.
	IgnoreTimeout bool
}

// Executor is the fake.
type Executor struct {
	cfg Config

	mu       sync.Mutex
	seq      int
	execs    map[string]*execution
	order    []string
	lose     int
	hold     bool
	launches int
}

type execution struct {
	owned     ephemeral.Owned
	input     ephemeral.Input
	timeout   time.Duration
	createdAt time.Time
	startAt   time.Time
	endAt     time.Time
	state     ephemeral.State
}

var _ ephemeral.Executor = (*Executor)(nil)

// New returns a pool listing cfg.Offers.
func New(cfg Config) *Executor { return &Executor{cfg: cfg, execs: map[string]*execution{}} }

// support is what the fake promises.
var support = capacity.EphemeralSupport{CancelQueued: true, ProviderTTL: true, IdempotentLaunch: capacity.IdempotencyLaunchKey,
	ListOwned: true, ExactPricing: true, StandingPool: true}

// Support reports what the fake promises.
func (e *Executor) Support() capacity.EphemeralSupport { return support }

// Declaration states the lane.
func (e *Executor) Declaration() capacity.Declaration {
	s := support
	return capacity.Declaration{Type: Type, Lane: capacity.LaneEphemeral, Ephemeral: &s}
}

// LoseNextLaunch makes the next n launches queue their execution and then
// fail with an uncoded error, as a lost answer does.
func (e *Executor) LoseNextLaunch(n int) { e.mu.Lock(); e.lose += n; e.mu.Unlock() }

// Hold keeps every execution queued (a pool with no free worker) while on.
func (e *Executor) Hold(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hold = on
	if !on {
		now := time.Now()
		for _, x := range e.execs {
			if x.state == ephemeral.StateQueued {
				e.schedule(x, now)
			}
		}
	}
}

// Launches counts executions ever queued (lost answers included).
func (e *Executor) Launches() int { e.mu.Lock(); defer e.mu.Unlock(); return e.launches }

// Executions lists every execution's state, by id.
func (e *Executor) Executions() map[string]ephemeral.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]ephemeral.State{}
	for id, x := range e.execs {
		e.advance(x, time.Now())
		out[id] = x.state
	}
	return out
}

func (e *Executor) enter() error {
	if e.cfg.RejectCredentials {
		return capacity.Errorf(capacity.CodeUnauthorized, "fake executor: credentials refused")
	}
	return nil
}

// Verify checks the credentials.
func (e *Executor) Verify(context.Context) error { return e.enter() }

// ListOffers lists the offers q matches.
func (e *Executor) ListOffers(_ context.Context, q ephemeral.OfferQuery) ([]ephemeral.Offer, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	var out []ephemeral.Offer
	for _, o := range e.cfg.Offers {
		if q.Matches(o) {
			out = append(out, o)
		}
	}
	return out, nil
}

// Launch queues an execution, unless one with its launch key exists.
func (e *Executor) Launch(_ context.Context, req ephemeral.LaunchRequest) (ephemeral.LaunchReceipt, error) {
	if err := e.enter(); err != nil {
		return ephemeral.LaunchReceipt{}, err
	}
	if err := req.Validate(); err != nil {
		return ephemeral.LaunchReceipt{}, err
	}
	if !slices.ContainsFunc(e.cfg.Offers, func(o ephemeral.Offer) bool { return o.ID == req.OfferID }) {
		return ephemeral.LaunchReceipt{}, capacity.Errorf(capacity.CodeInvalid, "no offer %s", req.OfferID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	for _, id := range e.order {
		if x := e.execs[id]; x.owned.LaunchKey == req.LaunchKey && x.owned.OwnershipToken == req.OwnershipToken {
			e.advance(x, now)
			return ephemeral.LaunchReceipt{ExecutionID: id, State: x.state, AcceptedAt: x.createdAt, Duplicate: true}, nil
		}
	}
	e.seq++
	e.launches++
	id := fmt.Sprintf("ex-%06d", e.seq)
	x := &execution{owned: ephemeral.Owned{ExecutionID: id, OfferID: req.OfferID, LaunchKey: req.LaunchKey, RunID: req.RunID,
		OwnershipToken: req.OwnershipToken, State: ephemeral.StateQueued}, input: req.Input, createdAt: now, state: ephemeral.StateQueued,
		timeout: time.Duration(req.ExecutionTimeoutSeconds) * time.Second}
	if !e.hold {
		e.schedule(x, now)
	}
	e.execs[id] = x
	e.order = append(e.order, id)
	if e.lose > 0 {
		e.lose--
		return ephemeral.LaunchReceipt{}, &capacity.Error{Provider: Type, Op: "launch", Ref: req.LaunchKey, Message: "answer lost"}
	}
	return ephemeral.LaunchReceipt{ExecutionID: id, State: ephemeral.StateQueued, AcceptedAt: now}, nil
}

// schedule starts x's timeline at now: queued for QueueFor, then running
// for RunFor, or until released when its command is "hang".
func (e *Executor) schedule(x *execution, now time.Time) {
	x.startAt, x.endAt = now.Add(e.cfg.QueueFor), now.Add(e.cfg.QueueFor+e.cfg.RunFor)
	if slices.Contains(x.input.Command, "hang") {
		x.endAt = now.Add(24 * time.Hour)
	}
}

// advance moves x along its timeline.
func (e *Executor) advance(x *execution, now time.Time) {
	if x.state.Ended() || x.startAt.IsZero() {
		return
	}
	if !now.Before(x.startAt) {
		x.state = ephemeral.StateRunning
	}
	if x.timeout > 0 && !e.cfg.IgnoreTimeout && now.Sub(x.startAt) > x.timeout && x.endAt.Sub(x.startAt) > x.timeout {
		x.state = ephemeral.StateTimedOut
		return
	}
	if !now.Before(x.endAt) {
		x.state = ephemeral.StateSucceeded
		if slices.Contains(x.input.Command, "fail") {
			x.state = ephemeral.StateFailed
		}
	}
}

func (e *Executor) find(ref ephemeral.Ref) (*execution, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	x, ok := e.execs[ref.ExecutionID]
	if !ok || x.owned.OwnershipToken != ref.OwnershipToken || x.owned.OfferID != ref.OfferID {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no execution %s of ours", ref.ExecutionID)
	}
	return x, nil
}

// Observe reports an execution, with its output once it ended: the input
// it was given, as JSON.
func (e *Executor) Observe(_ context.Context, ref ephemeral.Ref) (ephemeral.Execution, error) {
	if err := e.enter(); err != nil {
		return ephemeral.Execution{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.find(ref)
	if err != nil {
		return ephemeral.Execution{}, err
	}
	now := time.Now()
	e.advance(x, now)
	out := ephemeral.Execution{ExecutionID: ref.ExecutionID, State: x.state, ObservedAt: now}
	if !x.startAt.IsZero() && x.state != ephemeral.StateQueued {
		out.QueueSeconds = x.startAt.Sub(x.createdAt).Seconds()
		end := now
		if x.endAt.Before(now) {
			end = x.endAt
		}
		out.RunSeconds = end.Sub(x.startAt).Seconds()
	}
	switch x.state {
	case ephemeral.StateSucceeded:
		out.Output, _ = json.Marshal(map[string]any{"echo": strings.Join(append(slices.Clone(x.input.Command), x.input.Args...), " ")})
	case ephemeral.StateFailed:
		out.Error = "the handler raised"
	}
	return out, nil
}

// Release cancels an execution, queued or running.
func (e *Executor) Release(_ context.Context, ref ephemeral.Ref) (ephemeral.Receipt, error) {
	if err := e.enter(); err != nil {
		return ephemeral.Receipt{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.find(ref)
	if err != nil {
		return ephemeral.Receipt{}, err
	}
	e.advance(x, time.Now())
	if x.state.Ended() {
		return ephemeral.Receipt{ExecutionID: ref.ExecutionID, State: x.state, Duplicate: true}, nil
	}
	x.state = ephemeral.StateCancelled
	return ephemeral.Receipt{ExecutionID: ref.ExecutionID, State: x.state}, nil
}

// Terminate is unsupported: the pool is standing.
func (e *Executor) Terminate(context.Context, ephemeral.Ref) (ephemeral.Receipt, error) {
	return ephemeral.Receipt{}, capacity.Errorf(capacity.CodeUnsupported, "fake executor: a standing pool; release the execution instead")
}

// ListOwned lists the executions carrying q's ownership token.
func (e *Executor) ListOwned(_ context.Context, q capacity.OwnershipQuery) ([]ephemeral.Owned, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []ephemeral.Owned
	now := time.Now()
	for _, id := range e.order {
		x := e.execs[id]
		if x.owned.OwnershipToken != q.OwnershipToken {
			continue
		}
		e.advance(x, now)
		o := x.owned
		o.State = x.state
		out = append(out, o)
	}
	return out, nil
}
