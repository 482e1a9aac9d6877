package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// LabelArtifacts lists the artifact digests a workload mounts
// (comma-separated), so disk collection keeps them while the workload
// exists, across agent restarts too.
const LabelArtifacts = "warmfleet.artifacts"

// ErrArtifactLogin: the artifact login the control plane gave was refused
// or could not connect.
var ErrArtifactLogin = errors.New("agent: the artifact login failed")

// applyPrepareArtifact fetches and verifies one artifact for an attempt or
// a prefetch. A failure is remembered for the attempt, so its launch fails
// with the same code instead of fetching the same wrong bytes again.
func (a *Agent) applyPrepareArtifact(ctx context.Context, m jetstream.Msg, c schemas.Command, rc *schemas.OperationReceipt) {
	p := c.PrepareArtifact
	if p.RunID != "" {
		a.report(ctx, schemas.WorkloadObservation{RunID: p.RunID, AttemptID: p.AttemptID, Phase: schemas.WorkloadPreparing})
	}
	stopInProgress := a.inProgress(ctx, m)
	defer stopInProgress()
	var progress func(done, total int64)
	stopProgress := func() {}
	if p.RunID != "" {
		send := a.runProgress(p.RunID, p.AttemptID)
		progress, stopProgress = a.trackProgress(ctx, func(ctx context.Context, tp schemas.TransferProgress) { tp.Artifact = p.Name; send(ctx, tp) })
	}
	content := schemas.ArtifactMount{Name: p.Name, Digest: p.Digest, SizeBytes: p.SizeBytes, Source: p.Source}
	a.diskMu.RLock()
	res, err := a.ensureArtifact(ctx, content, p.RunID, p.PrefetchID, progress)
	if err == nil && p.AttemptID != "" {
		a.holdArtifacts(p.AttemptID, p.Digest)
	}
	a.diskMu.RUnlock()
	stopProgress()
	rc.Outcome = outcomeOf(err, rc)
	if err != nil {
		rc.Code = artifactFailureCode(err)
		if p.AttemptID != "" {
			a.notePrepareFailure(p.AttemptID, rc.Code, rc.Message)
		}
		a.log.Warn("artifact not prepared", zap.String("name", p.Name), zap.String("digest", p.Digest), zap.String("code", string(rc.Code)), zap.Error(err))
		return
	}
	a.log.Info("artifact ready", zap.String("name", p.Name), zap.String("digest", p.Digest), zap.Bool("already_present", res.AlreadyPresent),
		zap.Bool("refetched", res.Refetched), zap.Int64("fetched_bytes", res.FetchedBytes))
}

// artifactMounts ensures each of a launch's artifacts (a replica already
// here is checked against its seal, a stat; one changed since it was
// hashed is hashed again) and returns their read-only bind mounts. The
// caller holds diskMu for reading.
func (a *Agent) artifactMounts(ctx context.Context, l *schemas.LaunchWorkload) ([]noderuntime.Mount, error) {
	out := make([]noderuntime.Mount, 0, len(l.Artifacts))
	for _, m := range l.Artifacts {
		res, err := a.ensureArtifact(ctx, m, l.RunID, "", nil)
		if err != nil {
			return nil, err
		}
		a.holdArtifacts(l.AttemptID, m.Digest)
		out = append(out, noderuntime.Mount{Source: res.Path, Target: m.Path, ReadOnly: true})
	}
	return out, nil
}

// ensureArtifact makes a verified replica of m present. Its source's
// credential is asked for only when bytes must actually be fetched.
func (a *Agent) ensureArtifact(ctx context.Context, m schemas.ArtifactMount, runID, prefetchID string, progress func(done, total int64)) (artifactstore.Result, error) {
	if a.artifacts == nil {
		return artifactstore.Result{}, errors.New("agent: this node keeps no artifact replicas")
	}
	src := &credentialedSource{a: a, content: m, runID: runID, prefetchID: prefetchID}
	defer src.close()
	res, err := a.artifacts.Ensure(ctx, artifactstore.Want{Digest: m.Digest, SizeBytes: m.SizeBytes, Source: src, Progress: progress})
	if err == nil {
		if terr := a.artifacts.Touch(m.Digest); terr != nil {
			a.log.Warn("artifact use not recorded", zap.String("digest", m.Digest), zap.Error(terr))
		}
	}
	if err == nil && !res.AlreadyPresent {
		// A new replica: placement should hear of it before the next
		// periodic report.
		changeWatch{changed: a.factsChanged}.signal()
	}
	return res, err
}

// credentialedSource opens an artifact's source under a credential the
// control plane gives for this fetch; it asks again after the source
// refused one. The credential lives in memory until close.
type credentialedSource struct {
	a                 *Agent
	content           schemas.ArtifactMount
	runID, prefetchID string

	mu     sync.Mutex
	inner  artifactstore.Source
	closer func()
}

func (s *credentialedSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inner == nil {
		inner, closer, err := s.a.openSource(ctx, s.content, s.runID, s.prefetchID)
		if err != nil {
			return nil, err
		}
		s.inner, s.closer = inner, closer
	}
	rc, err := s.inner.Open(ctx, offset)
	if errors.Is(err, artifactstore.ErrSourceAuth) {
		s.reset()
	}
	return rc, err
}

func (s *credentialedSource) reset() {
	if s.closer != nil {
		s.closer()
	}
	s.inner, s.closer = nil, nil
}

func (s *credentialedSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
}

// openSource asks the control plane for the fetch's credential and builds
// the source it opens: a login scoped to reading the artifact bucket, or
// the URL's headers. Without NATS auth (a development bus) the object store
// is read on the agent's own connection.
func (a *Agent) openSource(ctx context.Context, m schemas.ArtifactMount, runID, prefetchID string) (artifactstore.Source, func(), error) {
	cred, err := a.artifactCredential(ctx, m.Digest, runID, prefetchID)
	if err != nil {
		return nil, nil, err
	}
	if m.Source.URL != "" {
		return artifactstore.NewURLSource(a.artifactHTTP(), m.Source.URL, cred.Headers), func() {}, nil
	}
	if cred.Login == nil || a.cfg.Credentials == nil {
		return artifactstore.NewObjectSource(a.conn.JS, bus.ObjectBucketArtifacts, m.Source.Object, m.Digest), func() {}, nil
	}
	nc, err := a.dialArtifactLogin(ctx, *cred.Login)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: log in to read %s: %w", ErrArtifactLogin, m.Digest, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("agent: jetstream for the artifact login: %w", err)
	}
	return artifactstore.NewObjectSource(js, bus.ObjectBucketArtifacts, m.Source.Object, m.Digest), nc.Close, nil
}

// artifactHTTP is the client URL sources are fetched with: no overall
// timeout (a fetch may take an hour), but bounded waits for a response.
func (a *Agent) artifactHTTP() *http.Client {
	if a.cfg.ArtifactHTTP != nil {
		return a.cfg.ArtifactHTTP
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = time.Minute
	return &http.Client{Transport: t}
}

// artifactFailureCode is the coded reason an artifact that could not be
// ensured fails its Run with.
func artifactFailureCode(err error) schemas.Code {
	switch {
	case errors.Is(err, artifactstore.ErrDigestMismatch):
		return schemas.CodeArtifactDigestMismatch
	case errors.Is(err, artifactstore.ErrSourceAuth), errors.Is(err, ErrArtifactLogin), errors.As(err, new(*ArtifactCredentialError)):
		return schemas.CodeArtifactSourceAuthFailed
	}
	return schemas.CodeArtifactFetchFailed
}

// holdArtifacts records artifacts an attempt uses, so disk collection
// keeps them until its workload is removed.
func (a *Agent) holdArtifacts(attemptID string, digests ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.held[attemptID]
	for _, d := range digests {
		if !slices.Contains(h.artifacts, d) {
			h.artifacts = append(h.artifacts, d)
		}
	}
	a.held[attemptID] = h
}

// notePrepareFailure remembers that an attempt's preparation failed, and
// why; prepareFailure reads it back for the attempt's launch.
func (a *Agent) notePrepareFailure(attemptID string, code schemas.Code, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failedPrep[attemptID] = prepFailure{code: code, msg: msg}
}

func (a *Agent) prepareFailure(attemptID string) (prepFailure, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.failedPrep[attemptID]
	return f, ok
}

type prepFailure struct {
	code schemas.Code
	msg  string
}
