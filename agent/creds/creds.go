// Package creds asks the control plane, under the node's current session,
// for the credentials a node needs at the moment it needs them: a
// registry's for an image pull, an artifact source's for one fetch, a
// Run's secret values for its launch. An answer is held in memory by the
// caller for that use only: never journaled, never logged (a credential's
// String names its kind, SecretValues' counts them).
package creds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Timeout bounds one ask. The control plane may run a credential helper
// (10s by default) to answer.
const Timeout = 20 * time.Second

// tries is how often an ask that got no answer (no replica listening, a
// timeout) is made before the use fails.
const tries = 3

// Requester does one request/reply with the control plane, waiting up to
// timeout, and decodes the answer into rep.
type Requester interface {
	Request(ctx context.Context, timeout time.Duration, subject string, req, rep any) error
}

// Metrics receives how long each ask for a registry credential took, and
// whether one came (the agent's ImageMetrics).
type Metrics interface {
	CredentialAsked(d time.Duration, answered bool)
}

// Asker asks for one node's credentials.
type Asker struct {
	NodeID    string
	Requester Requester
	// FencingToken is the node's current session's: the control plane
	// answers only that session.
	FencingToken func() uint64
	Metrics      Metrics // nil: none
	Log          *zap.Logger
}

// Registry is the ImageSpec.Credentials of a pull of reference (for
// runID's attempt, or a prefetch when empty): the runtime calls it only
// when a registry demands a credential, and the control plane is asked
// then.
func (a *Asker) Registry(reference, runID string) func(ctx context.Context, host string) (noderuntime.RegistryCredential, error) {
	return func(ctx context.Context, host string) (noderuntime.RegistryCredential, error) {
		start := time.Now()
		req := schemas.RegistryCredentialRequest{NodeID: a.NodeID, FencingToken: a.FencingToken(), Reference: reference, RunID: runID}
		var rep schemas.Reply[schemas.RegistryCredential]
		err := ask(ctx, a, bus.NodeRegistryCredentials(a.NodeID), req, &rep, "registry credential for "+host)
		if m := a.Metrics; m != nil {
			m.CredentialAsked(time.Since(start), err == nil && rep.OK != nil)
		}
		switch {
		case err != nil:
			return noderuntime.RegistryCredential{}, fmt.Errorf("ask the control plane for the credential of %s: %w", host, err)
		case rep.Refusal != nil:
			return noderuntime.RegistryCredential{}, fmt.Errorf("the control plane gave no credential for %s: %w", host, rep.Refusal)
		case rep.OK == nil:
			return noderuntime.RegistryCredential{}, errors.New("the control plane's credential answer is empty")
		}
		a.Log.Debug("registry credential received", zap.String("registry", rep.OK.Registry), zap.String("host", host),
			zap.Stringer("credential", rep.OK), zap.Duration("took", time.Since(start)))
		return *rep.OK, nil
	}
}

// Artifact asks for the credential of one fetch of digest (for runID's
// attempt or prefetchID) from byte offset.
func (a *Asker) Artifact(ctx context.Context, digest, runID, prefetchID string, offset int64) (schemas.ArtifactCredential, error) {
	req := schemas.ArtifactCredentialRequest{NodeID: a.NodeID, FencingToken: a.FencingToken(), Digest: digest, RunID: runID, PrefetchID: prefetchID, Offset: offset}
	var rep schemas.Reply[schemas.ArtifactCredential]
	err := ask(ctx, a, bus.NodeArtifactCredentials(a.NodeID), req, &rep, "artifact credential for "+digest)
	switch {
	case err != nil:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Err: err}
	case rep.Refusal != nil:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Refusal: rep.Refusal}
	case rep.OK == nil || rep.OK.Digest != digest:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Err: errors.New("the control plane's answer is empty or for another artifact")}
	}
	a.Log.Debug("artifact credential received", zap.String("digest", digest), zap.String("run_id", runID), zap.Stringer("credential", rep.OK))
	return *rep.OK, nil
}

// Secrets asks for the values of the secrets runID's attempt attemptID
// references, at its launch. The answer is the caller's to hold in memory
// for the workload's life; an error names no value (a refusal's reason
// names secrets by name only).
func (a *Asker) Secrets(ctx context.Context, runID, attemptID string) (schemas.SecretValues, error) {
	req := schemas.SecretRequest{NodeID: a.NodeID, FencingToken: a.FencingToken(), RunID: runID, AttemptID: attemptID}
	var rep schemas.Reply[schemas.SecretValues]
	err := ask(ctx, a, bus.NodeSecretCredentials(a.NodeID), req, &rep, "secrets of "+attemptID)
	switch {
	case err != nil:
		return schemas.SecretValues{}, fmt.Errorf("ask the control plane for the secrets of %s: %w", attemptID, err)
	case rep.Refusal != nil:
		return schemas.SecretValues{}, fmt.Errorf("the control plane gave no secrets for %s: %w", attemptID, rep.Refusal)
	case rep.OK == nil:
		return schemas.SecretValues{}, errors.New("the control plane's secrets answer is empty")
	}
	if err := rep.OK.Validate(); err != nil {
		return schemas.SecretValues{}, fmt.Errorf("the control plane's secrets for %s are out of bounds: %w", attemptID, err)
	}
	a.Log.Debug("secrets received", zap.String("run_id", runID), zap.String("attempt_id", attemptID), zap.Stringer("values", rep.OK))
	return *rep.OK, nil
}

// ask asks the control plane on subject and decodes its answer into rep,
// asking again, tries times in all, while no answer comes (no replica
// listening, a timeout), and after the delay a rate_limited refusal names
// (up to maxLimitedWait in all). what names the ask in logs.
func ask[R any](ctx context.Context, a *Asker, subject string, req any, rep *schemas.Reply[R], what string) error {
	var waited time.Duration
	for try := 1; ; {
		*rep = schemas.Reply[R]{}
		err := a.Requester.Request(ctx, Timeout, subject, req, rep)
		wait := time.Second
		switch r := rep.Refusal; {
		case err == nil && r != nil && r.Code == schemas.CodeRateLimited && waited < maxLimitedWait:
			// The control plane said when: the use waits, it does not fail.
			wait = min(max(r.RetryAfter(), 10*time.Millisecond), maxLimitedWait-waited)
			waited += wait
			a.Log.Info(what+" rate limited; asking again", zap.Duration("after", wait), zap.String("reason", r.Reason))
		case try == tries || ctx.Err() != nil || !(errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)):
			return err
		default:
			try++
			a.Log.Info(what+" not answered; asking again", zap.Int("try", try-1), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// maxLimitedWait bounds how long one use waits on rate_limited refusals
// before it fails with the last one: longer than any default limit's
// wait, shorter than an attempt's preparation is expected to take.
const maxLimitedWait = 5 * time.Minute

// ArtifactCredentialError is a fetch's credential that the control plane
// refused (Refusal set) or that could not be asked for. The fetch fails
// its Run with schemas.CodeArtifactSourceAuthFailed.
type ArtifactCredentialError struct {
	Digest  string
	Refusal *schemas.Refusal // nil: no answer
	Err     error            // the ask's own failure when Refusal is nil
}

func (e *ArtifactCredentialError) Error() string {
	if e.Refusal != nil {
		return fmt.Sprintf("the control plane gave no credential for artifact %s: %v", e.Digest, e.Refusal)
	}
	return fmt.Sprintf("ask the control plane for the credential of artifact %s: %v", e.Digest, e.Err)
}

func (e *ArtifactCredentialError) Unwrap() error {
	if e.Refusal != nil {
		return e.Refusal
	}
	return e.Err
}

// Code is the code a Run fails with for it: the refusal's own where the
// control plane found no object to read, else CodeArtifactSourceAuthFailed.
func (e *ArtifactCredentialError) Code() schemas.Code {
	if e.Refusal != nil && e.Refusal.Code == schemas.CodeArtifactFetchFailed {
		return schemas.CodeArtifactFetchFailed
	}
	return schemas.CodeArtifactSourceAuthFailed
}
