package agent

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

// CredentialTimeout bounds one ask for a registry credential. The control
// plane may run a credential helper (10s by default) to answer.
const CredentialTimeout = 20 * time.Second

// credentialTries is how often an ask that got no answer (no replica
// listening, a timeout) is made before the pull fails.
const credentialTries = 3

// registryCredentials is the ImageSpec.Credentials of a pull of reference
// (for runID's attempt, or a prefetch when empty): the runtime calls it
// only when a registry demands a credential, and the agent asks the
// control plane for it then, under its current session (core
// request/reply; the answer is never journaled or logged).
func (a *Agent) registryCredentials(reference, runID string) func(ctx context.Context, host string) (noderuntime.RegistryCredential, error) {
	return func(ctx context.Context, host string) (noderuntime.RegistryCredential, error) {
		start := time.Now()
		req := schemas.RegistryCredentialRequest{NodeID: a.cfg.NodeID, FencingToken: a.Enrollment().FencingToken, Reference: reference, RunID: runID}
		var rep schemas.Reply[schemas.RegistryCredential]
		err := askCredential(ctx, a, bus.NodeRegistryCredentials(a.cfg.NodeID), req, &rep, "registry credential for "+host)
		if m := a.cfg.ImageMetrics; m != nil {
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
		// The credential's String names its kind, never its secret.
		a.log.Debug("registry credential received", zap.String("registry", rep.OK.Registry), zap.String("host", host),
			zap.Stringer("credential", rep.OK), zap.Duration("took", time.Since(start)))
		return *rep.OK, nil
	}
}

// askCredential asks the control plane on subject (core request/reply) and
// decodes its answer into rep, asking again, credentialTries times in all,
// while no answer comes (no replica listening, a timeout). The answer is
// held in memory only; what names it in logs.
func askCredential[R any](ctx context.Context, a *Agent, subject string, req any, rep *schemas.Reply[R], what string) error {
	var err error
	for try := 1; ; try++ {
		err = a.requestWithin(ctx, CredentialTimeout, subject, req, rep)
		if try == credentialTries || ctx.Err() != nil || !(errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			return err
		}
		a.log.Info(what+" not answered; asking again", zap.Int("try", try), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
