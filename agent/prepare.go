package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// applyPrepare makes an image present for an attempt or a prefetch; the
// attempt holds it from then on, so its launch need not ensure it again.
func (a *Agent) applyPrepare(ctx context.Context, m jetstream.Msg, c schemas.Command, rc *schemas.OperationReceipt) {
	p := c.PrepareImage
	if p.RunID != "" {
		a.rep.workload(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPreparing})
	}
	defer inProgress(ctx, &a.wg, m)()
	spec := noderuntime.ImageSpec{Reference: p.Reference, ManifestDigest: p.ManifestDigest, Platform: p.Platform, Unpack: p.Unpack,
		Credentials: a.creds.Registry(p.Reference, p.RunID)}
	stopProgress := func() {}
	switch {
	case p.RunID != "":
		spec.Progress, stopProgress = trackProgress(ctx, &a.wg, a.cfg.ProgressInterval, a.rep.runProgress(p.RunID, p.AttemptID, ""))
	case p.PrefetchID != "":
		spec.Progress, stopProgress = trackProgress(ctx, &a.wg, a.cfg.ProgressInterval, a.rep.prefetchProgress(c.OperationID, p))
	}
	done := a.disk.Use()
	res, err := a.ensureImage(ctx, spec)
	if err == nil && p.AttemptID != "" {
		a.attempts.prepared(p.AttemptID, p.ManifestDigest)
	}
	done()
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
		a.rep.workload(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPrepared})
	}
}

// applyPrepareArtifact fetches and verifies one artifact for an attempt or
// a prefetch. A failure is remembered for the attempt, so its launch fails
// with the same code instead of fetching the same wrong bytes again.
func (a *Agent) applyPrepareArtifact(ctx context.Context, m jetstream.Msg, c schemas.Command, rc *schemas.OperationReceipt) {
	p := c.PrepareArtifact
	if p.RunID != "" {
		a.rep.workload(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPreparing})
	}
	defer inProgress(ctx, &a.wg, m)()
	var progress func(done, total int64)
	stopProgress := func() {}
	if p.RunID != "" {
		progress, stopProgress = trackProgress(ctx, &a.wg, a.cfg.ProgressInterval, a.rep.runProgress(p.RunID, p.AttemptID, p.Name))
	}
	content := schemas.ArtifactMount{Name: p.Name, Digest: p.Digest, SizeBytes: p.SizeBytes, Source: p.Source}
	done := a.disk.Use()
	res, err := a.replicas.ensure(ctx, content, p.RunID, p.PrefetchID, progress)
	if err == nil && p.AttemptID != "" {
		a.attempts.holdArtifact(p.AttemptID, p.Digest)
	}
	done()
	stopProgress()
	rc.Outcome = outcomeOf(err, rc)
	if err != nil {
		rc.Code = artifactFailureCode(err)
		if p.AttemptID != "" {
			a.attempts.failPrepare(p.AttemptID, rc.Code, rc.Message)
		}
		a.log.Warn("artifact not prepared", zap.String("name", p.Name), zap.String("digest", p.Digest), zap.String("code", string(rc.Code)), zap.Error(err))
		return
	}
	a.log.Info("artifact ready", zap.String("name", p.Name), zap.String("digest", p.Digest), zap.Bool("already_present", res.AlreadyPresent),
		zap.Bool("refetched", res.Refetched), zap.Int64("fetched_bytes", res.FetchedBytes))
}

// inProgress tells JetStream every 10s that a command is in hand, until
// the returned stop is called: a pull or a fetch can outlast AckWait. The
// goroutine runs in wg.
func inProgress(ctx context.Context, wg *sync.WaitGroup, m jetstream.Msg) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	wg.Go(func() {
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
