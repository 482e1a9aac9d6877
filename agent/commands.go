package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// queuedCmd is a command message with its decoded body: it is decoded once,
// in enqueue, to route it, and handled from that.
type queuedCmd struct {
	m jetstream.Msg
	c schemas.Command
}

// enqueue decodes a command and routes it to its attempt's queue.
func (a *Agent) enqueue(queues *keyed.Pool[queuedCmd], m jetstream.Msg) {
	var c schemas.Command
	if err := codec.Decode(codec.Detect(m.Headers(), m.Data()), m.Data(), &c); err != nil {
		a.log.Warn("malformed command terminated", zap.Error(err))
		_ = m.Term()
		return
	}
	queues.Submit(attemptOf(c), queuedCmd{m, c}) // false only after ctx ended: m stays unacked
}

func attemptOf(c schemas.Command) string {
	switch {
	case c.Launch != nil:
		return c.Launch.AttemptID
	case c.PrepareImage != nil && c.PrepareImage.AttemptID != "":
		return c.PrepareImage.AttemptID
	case c.PrepareArtifact != nil && c.PrepareArtifact.AttemptID != "":
		return c.PrepareArtifact.AttemptID
	case c.Stop != nil:
		return c.Stop.AttemptID
	}
	return "op:" + c.OperationID
}

// handle applies one command at most once and acks it after the outcome is
// journaled. The order matters: effect, journal append, receipt (while the
// journal syncs, for the kinds syncBeforeAck names), ack. A crash before
// the ack redelivers the command and the runtime's own idempotency
// absorbs the repeat.
func (a *Agent) handle(ctx context.Context, m jetstream.Msg, c schemas.Command) {
	rc := receiptFor(c, a.cfg.Now())
	enr := a.Enrollment()
	switch admit(c, a.cfg.NodeID, enr, &rc) {
	case refused:
		a.finish(ctx, m, c, rc, false, nil)
		return
	case superseded:
		// A newer session of this node exists: this process is the stale
		// one and must not act. Leave the command for the current session.
		_ = m.Nak()
		a.supersede(fmt.Errorf("%w: command %s carries fencing token %d, this session holds %d", ErrSuperseded, c.OperationID, c.FencingToken, enr.FencingToken))
		return
	}
	if prev, ok := a.journal.Lookup(c.OperationID); ok {
		rc.Duplicate, rc.Outcome, rc.Code, rc.Message = true, prev.Outcome, prev.Code, prev.Message
		a.finish(ctx, m, c, rc, false, nil)
		return
	}
	stopReason := ""
	switch c.Kind {
	case schemas.CmdPrepareImage:
		a.applyPrepare(ctx, m, c, &rc)
	case schemas.CmdPrepareArtifact:
		a.applyPrepareArtifact(ctx, m, c, &rc)
	case schemas.CmdLaunchWorkload:
		a.applyLaunch(ctx, c, &rc)
	case schemas.CmdStopWorkload:
		stopReason = c.Stop.Reason
		a.applyStop(ctx, c, &rc)
	case schemas.CmdReconcile:
		err := a.workloads.reconcile(ctx, a.meter.facts(ctx))
		rc.Outcome = outcomeOf(err, &rc)
	}
	if ctx.Err() != nil {
		return // shutting down mid-effect: unacked, so it is redelivered
	}
	a.commit(ctx, m, c, rc, stopReason)
}

// receiptFor is a command's receipt before its outcome is known.
func receiptFor(c schemas.Command, now time.Time) schemas.OperationReceipt {
	rc := schemas.OperationReceipt{OperationID: c.OperationID, Kind: c.Kind, AcceptedAt: now}
	rc.RunID, rc.AttemptID = runOf(c)
	if c.PrepareImage != nil {
		rc.PrefetchID = c.PrepareImage.PrefetchID
	}
	if c.PrepareArtifact != nil {
		rc.PrefetchID = c.PrepareArtifact.PrefetchID
	}
	return rc
}

// admission is what admit decided about a command.
type admission int

const (
	admitted   admission = iota
	refused              // rc says why
	superseded           // it comes from a newer session of this node
)

// admit checks a command is well formed, for this node, and of this
// session and generation; a refusal is written into rc.
func admit(c schemas.Command, nodeID string, enr schemas.Enrollment, rc *schemas.OperationReceipt) admission {
	if err := c.Validate(); err != nil {
		ref := schemas.AsRefusal(err)
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeRefused, ref.Code, ref.Error()
		return refused
	}
	switch {
	case c.NodeID != nodeID:
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeRefused, schemas.CodeWrongNode, "command addressed to node "+c.NodeID
	case c.FencingToken > enr.FencingToken:
		return superseded
	case c.FencingToken < enr.FencingToken:
		rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeStaleFencingToken
		rc.Message = fmt.Sprintf("command stamped with fencing token %d; this session holds %d", c.FencingToken, enr.FencingToken)
	case c.Generation != enr.Generation:
		rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeStaleGeneration
		rc.Message = fmt.Sprintf("command for generation %d; this node is generation %d", c.Generation, enr.Generation)
	default:
		return admitted
	}
	return refused
}

// commit journals an applied command's outcome, then publishes its receipt
// and acks it (finish). The disk flushes while the receipt travels. The
// ack waits for both: until then a crash redelivers the command, and the
// runtime's idempotency and the receipt's Nats-Msg-Id absorb the repeat.
// A prepare is acked without the flush (syncBeforeAck).
func (a *Agent) commit(ctx context.Context, m jetstream.Msg, c schemas.Command, rc schemas.OperationReceipt, stopReason string) {
	if f := a.cfg.Faults; f != nil && f.SkipJournal != nil && f.SkipJournal(c) {
		return
	}
	if err := a.journal.Append(JournalEntry{OperationID: c.OperationID, Kind: c.Kind, RunID: rc.RunID, AttemptID: rc.AttemptID,
		Outcome: rc.Outcome, Code: rc.Code, Message: rc.Message, StopReason: stopReason, AppliedAt: a.cfg.Now()}); err != nil {
		a.log.Error("journal write failed; command will be redelivered", zap.String("op", c.OperationID), zap.Error(err))
		_ = m.Nak()
		return
	}
	var synced chan error
	if syncBeforeAck(c.Kind) {
		synced = make(chan error, 1)
		go func() { synced <- a.journal.Sync() }()
	}
	if f := a.cfg.Faults; f != nil && f.LeaveUnacked != nil && f.LeaveUnacked(c) {
		_ = a.rep.receipt(ctx, c, rc)
		if synced != nil {
			<-synced
		}
		return
	}
	a.finish(ctx, m, c, rc, true, synced)
}

// finish publishes the receipt, waits for the journal entry to be durable
// (synced, when the command was applied), and acks. A receipt that cannot
// be published, or an entry that cannot be synced, leaves the command
// unacked: the redelivery answers from the journal.
func (a *Agent) finish(ctx context.Context, m jetstream.Msg, c schemas.Command, rc schemas.OperationReceipt, applied bool, synced <-chan error) {
	err := a.rep.receipt(ctx, c, rc)
	if synced != nil {
		if serr := <-synced; serr != nil {
			a.log.Error("journal sync failed; command will be redelivered", zap.String("op", c.OperationID), zap.Error(serr))
			_ = m.Nak()
			return
		}
	}
	if err != nil {
		a.log.Warn("receipt not published; command will be redelivered", zap.String("op", c.OperationID), zap.Error(err))
		_ = m.Nak()
		return
	}
	_ = m.Ack()
	a.log.Debug("command done", zap.String("op", c.OperationID), zap.String("outcome", rc.Outcome), zap.Bool("duplicate", rc.Duplicate), zap.Bool("applied", applied))
}

func runOf(c schemas.Command) (string, string) {
	switch {
	case c.Launch != nil:
		return c.Launch.RunID, c.Launch.AttemptID
	case c.PrepareImage != nil:
		return c.PrepareImage.RunID, c.PrepareImage.AttemptID
	case c.PrepareArtifact != nil:
		return c.PrepareArtifact.RunID, c.PrepareArtifact.AttemptID
	case c.Stop != nil:
		return c.Stop.RunID, c.Stop.AttemptID
	}
	return "", ""
}

func outcomeOf(err error, rc *schemas.OperationReceipt) string {
	if err == nil {
		return schemas.OutcomeApplied
	}
	rc.Message = err.Error()
	return schemas.OutcomeFailed
}

// applyStop stops an attempt's workload. One never launched here is
// reported failed, and the journal entry for this stop refuses a launch
// that arrives later.
func (a *Agent) applyStop(ctx context.Context, c schemas.Command, rc *schemas.OperationReceipt) {
	s := c.Stop
	err := a.rt.Stop(ctx, s.AttemptID, time.Duration(s.GraceSeconds)*time.Second)
	if errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		// Never launched here: say so, and the journal entry for this stop
		// refuses a launch that arrives later. What its prepare held goes.
		err = nil
		a.attempts.release(s.AttemptID)
		a.rep.workload(ctx, schemas.WorkloadObservation{RunID: s.RunID, AttemptID: s.AttemptID, Phase: schemas.WorkloadFailed,
			FailureReason: "stopped before launch", StopReason: s.Reason})
	}
	rc.Outcome = outcomeOf(err, rc)
}

// syncBeforeAck says whether a command's journal entry must be on disk
// before its ack. A launch or a stop must: applied again it could start a
// workload a second time, or let a launch through after its stop. A prepare need not:
// its effect is content held by digest, the same however often applied,
// and its entry only answers a repeat as a duplicate. Written before the
// ack, the entry survives the agent process dying (the page cache keeps
// it); only the machine failing can lose it, and then a repeat is applied
// again to the same effect, its receipt stored once by its Nats-Msg-Id.
// The next synced entry flushes it too. Prepares are most of the commands,
// and an fsync slows everything else on the machine while it runs.
func syncBeforeAck(k schemas.CommandKind) bool {
	return k != schemas.CmdPrepareImage && k != schemas.CmdPrepareArtifact
}
