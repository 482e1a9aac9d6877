package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// change mutates a Run and appends the events describing what it did with
// emit. Returning bus.ErrNoChange means the Run already reflects the change.
type change func(r *schemas.Run, emit func(schemas.RunEvent)) error

// advance applies ch to the stored Run by CAS, then publishes the change's
// events. When ch finds nothing to do, nothing is published, unless ctx is
// marked for repair (a redelivered message: its first delivery may have
// stopped between an earlier CAS and its publish); then the Run's outbox is
// published again and the events' Nats-Msg-Id keeps the log free of
// duplicates. A publish that fails after its CAS leaves the Run marked for
// the reconcile loop's outbox repair (outbox.go).
func (cp *ControlPlane) advance(ctx context.Context, runID string, ch change) (schemas.Run, error) {
	now := cp.now()
	// The cached copy seeds the CAS: most writes then need no read first.
	run, rev, raw, err := bus.UpdateJSONFrom(ctx, cp.runsKV, runID, cp.cache.runSeed(runID), func(r *schemas.Run) error {
		prev := r.Outbox
		r.Outbox = nil
		from := r.Phase
		emit := func(ev schemas.RunEvent) { cp.appendEvent(r, ev, now) }
		if err := ch(r, emit); err != nil {
			r.Outbox = prev
			return err
		}
		if r.Phase != from {
			if err := checkTransition(from, r.Phase); err != nil {
				return err
			}
			r.PhaseSince = now
			if r.Phase != schemas.PhasePreparing {
				r.Progress = nil
			}
		}
		r.UpdatedAt = now
		return nil
	})
	if err != nil && !errors.Is(err, bus.ErrNoChange) {
		return run, fmt.Errorf("run %s: %w", runID, err)
	}
	if err == nil {
		cp.cache.noteRun(run, rev, raw)
		cp.metrics.transitions.Add(1)
	} else if !repairing(ctx) {
		return run, err // bus.ErrNoChange: the stored outbox was published by the change that wrote it
	}
	if perr := cp.publishEvents(ctx, run.Outbox); perr != nil {
		if err == nil {
			cp.outbox.mark(runID)
		}
		return run, perr
	}
	return run, err
}

// createRun stores a new Run and publishes its accepted event, and its
// first decision when intake could already make it (decideAtIntake).
func (cp *ControlPlane) createRun(ctx context.Context, req schemas.RunRequest) (schemas.Run, bool, error) {
	now := cp.now()
	run := schemas.Run{
		ID: schemas.RunIDFor(req.RequestID), Request: req, Phase: schemas.PhaseAccepted,
		CreatedAt: now, UpdatedAt: now, PhaseSince: now,
	}
	cp.appendEvent(&run, schemas.RunEvent{Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted}, now)
	cp.decideAtIntake(&run, func(ev schemas.RunEvent) { cp.appendEvent(&run, ev, now) })
	raw, rev, err := bus.CreateJSONRaw(ctx, cp.runsKV, run.ID, &run)
	if errors.Is(err, jetstream.ErrKeyExists) {
		var stored schemas.Run
		if _, gerr := bus.GetJSON(ctx, cp.runsKV, run.ID, &stored); gerr != nil {
			return run, false, fmt.Errorf("run %s: read existing: %w", run.ID, gerr)
		}
		return stored, true, nil
	}
	if err != nil {
		return run, false, fmt.Errorf("run %s: create: %w", run.ID, err)
	}
	cp.cache.noteRun(run, rev, raw)
	if err := cp.publishEvents(ctx, run.Outbox); err != nil {
		// The submit is redelivered and repairs it as a duplicate; the
		// reconcile loop repairs it too should the submit be gone.
		cp.outbox.mark(run.ID)
		return run, false, err
	}
	return run, false, nil
}

// publishEvents appends events to WF_EVENTS, each deduplicated by run:seq.
// Several go out together and are then awaited: one connection keeps their
// order in the stream, and a Run's accepted and decided events cost one
// round trip instead of two.
func (cp *ControlPlane) publishEvents(ctx context.Context, evs []schemas.RunEvent) error {
	if len(evs) == 1 {
		return cp.publishEvent(ctx, evs[0], eventMsgID(evs[0]))
	}
	acks := make([]jetstream.PubAckFuture, 0, len(evs))
	for _, ev := range evs {
		m, err := eventMsg(ev)
		if err != nil {
			return err
		}
		cp.metrics.eventsSent.Add(1)
		f, err := cp.conn.JS.PublishMsgAsync(m, jetstream.WithMsgID(eventMsgID(ev)))
		if err != nil {
			return cp.eventFailed(ev, eventMsgID(ev), err)
		}
		acks = append(acks, f)
	}
	timeout := time.NewTimer(eventPublishTimeout)
	defer timeout.Stop()
	for i, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return cp.eventFailed(evs[i], eventMsgID(evs[i]), err)
		case <-timeout.C:
			return cp.eventFailed(evs[i], eventMsgID(evs[i]), context.DeadlineExceeded)
		case <-ctx.Done():
			return cp.eventFailed(evs[i], eventMsgID(evs[i]), ctx.Err())
		}
	}
	return nil
}

// eventPublishTimeout bounds waiting for WF_EVENTS to store an event.
const eventPublishTimeout = 5 * time.Second

func eventMsgID(ev schemas.RunEvent) string { return ev.RunID + ":" + strconv.FormatUint(ev.Seq, 10) }

// eventMsg is ev as JSON, the encoding operators read.
func eventMsg(ev schemas.RunEvent) (*nats.Msg, error) {
	b, err := codec.Encode(codec.JSON, ev)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: bus.RunEvents(ev.RunID), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	return m, nil
}

// publishEvent appends one event.
func (cp *ControlPlane) publishEvent(ctx context.Context, ev schemas.RunEvent, msgID string) error {
	m, err := eventMsg(ev)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, eventPublishTimeout)
	defer cancel()
	cp.metrics.eventsSent.Add(1)
	if _, err := cp.conn.JS.PublishMsg(pctx, m, jetstream.WithMsgID(msgID)); err != nil {
		return cp.eventFailed(ev, msgID, err)
	}
	return nil
}

func (cp *ControlPlane) eventFailed(ev schemas.RunEvent, msgID string, err error) error {
	cp.log.Warn("publish run event failed", zap.String("run_id", ev.RunID), zap.Uint64("seq", ev.Seq), zap.Error(err))
	return fmt.Errorf("publish event %s: %w", msgID, err)
}

// appendEvent numbers ev as r's next event, stamps it, and adds it to r's
// outbox, with its decision bounded (Compact) for storing and publishing.
func (cp *ControlPlane) appendEvent(r *schemas.Run, ev schemas.RunEvent, now time.Time) {
	if ev.Decision != nil && len(ev.Decision.Candidates) > cp.cfg.DecisionCandidates {
		d := ev.Decision.Compact(cp.cfg.DecisionCandidates)
		ev.Decision = &d
	}
	r.EventSeq++
	ev.RunID, ev.Seq, ev.At = r.ID, r.EventSeq, now
	if ev.RequestID == "" && ev.Type == schemas.EventAccepted {
		ev.RequestID = r.Request.RequestID
	}
	r.Outbox = append(r.Outbox, ev)
}

// phaseEvent describes a phase change.
func phaseEvent(r *schemas.Run, from schemas.Phase, code schemas.Code, msg string) schemas.RunEvent {
	return schemas.RunEvent{
		Type: schemas.EventPhase, From: from, Phase: r.Phase, NodeID: r.NodeID, Attempt: r.Attempt,
		Code: code, Message: msg, ExitCode: r.ExitCode, OOMKilled: r.OOMKilled,
	}
}
