package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

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

// Code is the code a Run fails with for it.
func (e *ArtifactCredentialError) Code() schemas.Code { return schemas.CodeArtifactSourceAuthFailed }

// artifactCredential asks the control plane, under the agent's current
// session, for the credential of one fetch of digest (for runID's attempt
// or prefetchID). The answer is held in memory by the caller for that
// fetch only: never journaled, never logged (its String names its kind).
func (a *Agent) artifactCredential(ctx context.Context, digest, runID, prefetchID string) (schemas.ArtifactCredential, error) {
	req := schemas.ArtifactCredentialRequest{NodeID: a.cfg.NodeID, FencingToken: a.Enrollment().FencingToken, Digest: digest, RunID: runID, PrefetchID: prefetchID}
	var rep schemas.Reply[schemas.ArtifactCredential]
	err := askCredential(ctx, a, bus.NodeArtifactCredentials(a.cfg.NodeID), req, &rep, "artifact credential for "+digest)
	switch {
	case err != nil:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Err: err}
	case rep.Refusal != nil:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Refusal: rep.Refusal}
	case rep.OK == nil || rep.OK.Digest != digest:
		return schemas.ArtifactCredential{}, &ArtifactCredentialError{Digest: digest, Err: errors.New("the control plane's answer is empty or for another artifact")}
	}
	a.log.Debug("artifact credential received", zap.String("digest", digest), zap.String("run_id", runID), zap.Stringer("credential", rep.OK))
	return *rep.OK, nil
}

// dialArtifactLogin opens the connection of an object-store login
// (bus.DialArtifactLogin) over the agent's artifact transport. The caller
// closes it after the fetch.
func (a *Agent) dialArtifactLogin(ctx context.Context, login schemas.ArtifactLogin) (*nats.Conn, error) {
	tr := a.cfg.ArtifactTransport
	if tr == nil {
		t := bus.TransportOf(a.conn.NC)
		tr = &t
	}
	return bus.DialArtifactLogin(ctx, *tr, a.cfg.NodeID, login.User, login.Token)
}

// ArtifactCredential is artifactCredential for tests and for the replica
// store's wiring.
func (a *Agent) ArtifactCredential(ctx context.Context, digest, runID, prefetchID string) (schemas.ArtifactCredential, error) {
	return a.artifactCredential(ctx, digest, runID, prefetchID)
}

// DialArtifactLogin is dialArtifactLogin for tests and for the replica
// store's wiring.
func (a *Agent) DialArtifactLogin(ctx context.Context, login schemas.ArtifactLogin) (*nats.Conn, error) {
	return a.dialArtifactLogin(ctx, login)
}
