package agent

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/agent/creds"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// ArtifactCredentialError is a fetch's credential that the control plane
// refused or that could not be asked for (creds.ArtifactCredentialError).
type ArtifactCredentialError = creds.ArtifactCredentialError

// requestTimeout bounds the agent's own requests (enrollment, renewal,
// what the disk must keep).
const requestTimeout = 5 * time.Second

// requester does the agent's msgpack request/replies with the control
// plane on its connection (creds.Requester).
type requester struct{ nc *nats.Conn }

// Request sends req on subject and decodes the answer into rep, waiting up
// to timeout.
func (r requester) Request(ctx context.Context, timeout time.Duration, subject string, req, rep any) error {
	b, err := codec.Encode(codec.MsgPack, req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := r.nc.RequestWithContext(rctx, subject, b)
	if err != nil {
		return err
	}
	return codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, rep)
}

// ArtifactCredential asks the control plane, under the agent's current
// session, for the credential of one fetch of digest; for tests and for
// the replica store's wiring.
func (a *Agent) ArtifactCredential(ctx context.Context, digest, runID, prefetchID string) (schemas.ArtifactCredential, error) {
	return a.creds.Artifact(ctx, digest, runID, prefetchID, 0)
}

// DialArtifactLogin opens the connection of an object-store login
// (bus.DialArtifactLogin) over the agent's artifact transport; for tests
// and for the replica store's wiring. The caller closes it.
func (a *Agent) DialArtifactLogin(ctx context.Context, login schemas.ArtifactLogin) (*nats.Conn, error) {
	return a.replicas.dialLogin(ctx, login)
}
