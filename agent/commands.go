package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	rc := schemas.OperationReceipt{OperationID: c.OperationID, Kind: c.Kind, AcceptedAt: a.cfg.Now()}
	rc.RunID, rc.AttemptID = runOf(c)
	if c.PrepareImage != nil {
		rc.PrefetchID = c.PrepareImage.PrefetchID
	}
	if c.PrepareArtifact != nil {
		rc.PrefetchID = c.PrepareArtifact.PrefetchID
	}
	enr := a.Enrollment()

	if err := c.Validate(); err != nil {
		ref := schemas.AsRefusal(err)
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeRefused, ref.Code, ref.Error()
		a.finish(ctx, m, c, rc, false, nil)
		return
	}
	switch {
	case c.NodeID != a.cfg.NodeID:
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeRefused, schemas.CodeWrongNode, "command addressed to node "+c.NodeID
		a.finish(ctx, m, c, rc, false, nil)
		return
	case c.FencingToken > enr.FencingToken:
		// A newer session of this node exists: this process is the stale
		// one and must not act. Leave the command for the current session.
		_ = m.Nak()
		a.supersede(fmt.Errorf("%w: command %s carries fencing token %d, this session holds %d", ErrSuperseded, c.OperationID, c.FencingToken, enr.FencingToken))
		return
	case c.FencingToken < enr.FencingToken:
		rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeStaleFencingToken
		rc.Message = fmt.Sprintf("command stamped with fencing token %d; this session holds %d", c.FencingToken, enr.FencingToken)
		a.finish(ctx, m, c, rc, false, nil)
		return
	case c.Generation != enr.Generation:
		rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeStaleGeneration
		rc.Message = fmt.Sprintf("command for generation %d; this node is generation %d", c.Generation, enr.Generation)
		a.finish(ctx, m, c, rc, false, nil)
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
		err := a.reconcile(ctx, a.facts(ctx))
		rc.Outcome = outcomeOf(err, &rc)
	}
	if ctx.Err() != nil {
		return // shutting down mid-effect: unacked, so it is redelivered
	}
	if f := a.cfg.Faults; f != nil && f.SkipJournal != nil && f.SkipJournal(c) {
		return
	}
	if err := a.journal.Append(JournalEntry{OperationID: c.OperationID, Kind: c.Kind, RunID: rc.RunID, AttemptID: rc.AttemptID,
		Outcome: rc.Outcome, Code: rc.Code, Message: rc.Message, StopReason: stopReason, AppliedAt: a.cfg.Now()}); err != nil {
		a.log.Error("journal write failed; command will be redelivered", zap.String("op", c.OperationID), zap.Error(err))
		_ = m.Nak()
		return
	}
	// The disk flushes while the receipt travels. The ack waits for both:
	// until then a crash redelivers the command, and the runtime's
	// idempotency and the receipt's Nats-Msg-Id absorb the repeat. A
	// prepare is acked without the flush (syncBeforeAck).
	var synced chan error
	if syncBeforeAck(c.Kind) {
		synced = make(chan error, 1)
		go func() { synced <- a.journal.Sync() }()
	}
	if f := a.cfg.Faults; f != nil && f.LeaveUnacked != nil && f.LeaveUnacked(c) {
		_ = a.publishReceipt(ctx, c, rc)
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
	err := a.publishReceipt(ctx, c, rc)
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

// publishReceipt sends rc, deduplicated per operation and session: a
// redelivered command's receipt is stored once.
func (a *Agent) publishReceipt(ctx context.Context, c schemas.Command, rc schemas.OperationReceipt) error {
	dedupe := "rcpt:" + c.OperationID + ":" + strconv.FormatUint(c.FencingToken, 10)
	return a.publish(ctx, schemas.Observation{Kind: schemas.ObsReceipt, Receipt: &rc}, dedupe)
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

func (a *Agent) applyPrepare(ctx context.Context, m jetstream.Msg, c schemas.Command, rc *schemas.OperationReceipt) {
	p := c.PrepareImage
	if p.RunID != "" {
		a.report(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPreparing})
	}
	stopInProgress := a.inProgress(ctx, m)
	defer stopInProgress()
	spec := noderuntime.ImageSpec{Reference: p.Reference, ManifestDigest: p.ManifestDigest, Platform: p.Platform, Unpack: p.Unpack,
		Credentials: a.registryCredentials(p.Reference, p.RunID)}
	stopProgress := func() {}
	switch {
	case p.RunID != "":
		spec.Progress, stopProgress = a.trackProgress(ctx, a.runProgress(p.RunID, p.AttemptID))
	case p.PrefetchID != "":
		spec.Progress, stopProgress = a.trackProgress(ctx, a.prefetchProgress(c.OperationID, p))
	}
	a.diskMu.RLock()
	res, err := a.ensureImage(ctx, spec)
	if err == nil && p.AttemptID != "" {
		a.hold(p.AttemptID, p.ManifestDigest, nil)
	}
	a.diskMu.RUnlock()
	stopProgress() // no progress report may follow the prepared one
	rc.Outcome = outcomeOf(err, rc)
	if err != nil {
		rc.Code = failureCode(err)
		return
	}
	// A held image is the warm path, one per command: logged at debug,
	// so info keeps to transfers.
	level := zap.InfoLevel
	if res.AlreadyPresent {
		level = zap.DebugLevel
	}
	a.log.Log(level, "image ready", zap.String("digest", p.ManifestDigest), zap.Bool("already_present", res.AlreadyPresent),
		zap.String("source", res.Source), zap.Int64("fetched_bytes", res.FetchedBytes))
	if p.RunID != "" {
		a.report(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPrepared})
	}
}

// inProgress tells JetStream every 10s that a command is in hand, until
// the returned stop is called: a pull or a fetch can outlast AckWait.
func (a *Agent) inProgress(ctx context.Context, m jetstream.Msg) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	a.wg.Go(func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	})
	return cancel
}

// failureCode is the coded reason an image that could not be ensured
// fails its Run with.
func failureCode(err error) schemas.Code {
	switch {
	case errors.Is(err, noderuntime.ErrRegistryAuth):
		return schemas.CodeRegistryAuthFailed
	case errors.Is(err, noderuntime.ErrPlatformNotInImage):
		return schemas.CodePlatformNotInImage
	}
	return schemas.CodeLaunchFailed
}

func (a *Agent) applyLaunch(ctx context.Context, c schemas.Command, rc *schemas.OperationReceipt) {
	l := c.Launch
	if stop, ok := a.journal.Stopped(l.AttemptID); ok {
		// Stopped before it started (a cancel overtook the launch).
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeRefused, schemas.CodeCancelled, "attempt was stopped before launch: "+stop.StopReason
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed,
			FailureReason: "stopped before launch", StopReason: stop.StopReason})
		return
	}
	if f, ok := a.prepareFailure(l.AttemptID); ok {
		// Its preparation already failed for a reason a retry here would
		// meet again (wrong bytes, a refused credential).
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, f.code, "preparation failed: "+f.msg
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed,
			FailureReason: rc.Message, FailureCode: f.code})
		return
	}
	if !a.offersNetwork(l.Network) {
		// Placement does not book such a Run here; this is the defence
		// against a booking made on older facts.
		rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeNetworkUnavailable
		rc.Message = "network " + schemas.NetworkModeOf(l.Network) + " is not offered on this node"
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed, FailureReason: rc.Message})
		return
	}
	// The workload learns who it is from the environment, after the
	// request's own variables so they cannot be spoofed by it.
	env := make([]string, 0, len(l.Env)+3)
	for _, e := range l.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	env = append(env, "WARMFLEET_RUN_ID="+l.RunID, "WARMFLEET_ATTEMPT_ID="+l.AttemptID, "WARMFLEET_NODE_ID="+a.cfg.NodeID)
	if len(l.GPUs) > 0 {
		// The cards' UUIDs, as placement booked them: inside the
		// container CUDA numbers its cards from 0 whatever they are.
		env = append(env, "WARMFLEET_GPUS="+strings.Join(l.GPUs, ","))
	}
	spec := noderuntime.WorkloadSpec{
		ID: l.AttemptID, ImageReference: l.Reference, ManifestDigest: l.ManifestDigest, Platform: l.Platform, Command: l.Command, Env: env,
		CPUMillis: l.Resources.CPUMillis, MemoryBytes: l.Resources.MemoryBytes,
		Labels: map[string]string{
			LabelRunID: l.RunID, LabelAttemptID: l.AttemptID,
			LabelMaxRuntime: strconv.FormatInt(l.MaxRuntimeSeconds, 10),
		},
	}
	if len(l.GPUs) > 0 {
		spec.Labels[LabelGPUs] = strings.Join(l.GPUs, ",")
	}
	if len(l.Caches) > 0 {
		ids := make([]string, len(l.Caches))
		for i, c := range l.Caches {
			ids[i] = schemas.CacheItemID(c.Name, c.CompatibilityKey)
		}
		spec.Labels[LabelCaches] = strings.Join(ids, ",")
	}
	spec.Devices = l.Devices
	// From its caches' mount to its start the launch holds the disk for
	// reading, and what it uses is held for the attempt until its workload
	// is removed: no disk sweep takes either from under it.
	a.diskMu.RLock()
	defer a.diskMu.RUnlock()
	prepared := a.preparedImage(l.AttemptID, l.ManifestDigest)
	a.hold(l.AttemptID, l.ManifestDigest, l.Caches)
	// Caches become bind mounts, created on first use and marked used now.
	mounts, err := a.caches().mounts(l.Caches)
	if err != nil {
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, schemas.CodeLaunchFailed, err.Error()
		if errors.Is(err, ErrInvalidCache) {
			rc.Outcome, rc.Code = schemas.OutcomeRefused, schemas.CodeInvalidCache
		}
		a.release(l.AttemptID)
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed, FailureReason: err.Error()})
		return
	}
	if len(l.Artifacts) > 0 {
		digests := make([]string, len(l.Artifacts))
		for i, m := range l.Artifacts {
			digests[i] = m.Digest
		}
		spec.Labels[LabelArtifacts] = strings.Join(digests, ",")
		// Each replica is checked here (its seal, else a re-hash): one
		// changed on disk since its prepare is fetched again, never mounted.
		am, err := a.artifactMounts(ctx, l)
		if err != nil {
			a.release(l.AttemptID)
			rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, artifactFailureCode(err), err.Error()
			a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed,
				FailureReason: err.Error(), FailureCode: rc.Code})
			return
		}
		mounts = append(mounts, am...)
	}
	spec.Mounts = mounts
	withContainer(&spec, l)
	// A launch does not depend on its prepare having been applied first:
	// commands of one attempt can be redelivered out of order (a superseded
	// process hands one back), so without a prepare here the image is
	// ensured. After one, Launch's own check of the image suffices (the
	// hold kept sweeps off it); one removed all the same is ensured then.
	ensure := func() bool {
		_, err := a.ensureImage(ctx, noderuntime.ImageSpec{Reference: l.Reference, ManifestDigest: l.ManifestDigest, Platform: l.Platform, Unpack: true,
			Credentials: a.registryCredentials(l.Reference, l.RunID)})
		if err != nil {
			a.release(l.AttemptID)
			rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, failureCode(err), err.Error()
			a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed,
				FailureReason: err.Error(), FailureCode: rc.Code})
		}
		return err == nil
	}
	if !prepared && !ensure() {
		return
	}
	if spec.Output.Dir, err = a.prepareOutput(l.RunID, l.AttemptID); err != nil {
		a.release(l.AttemptID)
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, schemas.CodeLaunchFailed, err.Error()
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed, FailureReason: err.Error()})
		return
	}
	spec.Output.BytesPerSecond, spec.Output.Burst = max(a.cfg.LogRate, 0), a.cfg.LogBurst
	a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadStarting})
	st, err := a.rt.Launch(ctx, spec)
	if prepared && errors.Is(err, noderuntime.ErrImageNotFound) {
		a.log.Warn("image gone since its prepare; ensuring it again", zap.String("workload", l.AttemptID), zap.String("digest", l.ManifestDigest))
		if !ensure() {
			_ = os.RemoveAll(spec.Output.Dir) // nothing ran, nothing was written
			return
		}
		st, err = a.rt.Launch(ctx, spec)
	}
	switch {
	case errors.Is(err, noderuntime.ErrWorkloadExists):
		// Launched by an earlier delivery whose journal write was lost.
		rc.Duplicate, rc.Outcome = true, schemas.OutcomeApplied
		a.watch(ctx, l.AttemptID)
	case err != nil:
		a.release(l.AttemptID)
		rc.Outcome, rc.Code, rc.Message = schemas.OutcomeFailed, schemas.CodeLaunchFailed, err.Error()
		a.report(ctx, schemas.WorkloadObservation{RunID: l.RunID, AttemptID: l.AttemptID, Phase: schemas.WorkloadFailed, FailureReason: err.Error()})
		_ = os.RemoveAll(spec.Output.Dir) // nothing ran, nothing was written
	default:
		rc.Outcome = schemas.OutcomeApplied
		a.log.Info("workload started", zap.String("run_id", l.RunID), zap.String("workload", l.AttemptID))
		a.report(ctx, observationOf(st))
		a.watch(ctx, l.AttemptID)
	}
}

func (a *Agent) applyStop(ctx context.Context, c schemas.Command, rc *schemas.OperationReceipt) {
	s := c.Stop
	err := a.rt.Stop(ctx, s.AttemptID, time.Duration(s.GraceSeconds)*time.Second)
	if errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		// Never launched here: say so, and the journal entry for this stop
		// refuses a launch that arrives later. What its prepare held goes.
		err = nil
		a.release(s.AttemptID)
		a.report(ctx, schemas.WorkloadObservation{RunID: s.RunID, AttemptID: s.AttemptID, Phase: schemas.WorkloadFailed,
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
