package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// authorizeArtifact admits an agent's one-time artifact login
// (bus.ArtifactUser): the token's grant in wf_artifact_grants, for this
// node, not expired, minted for the node's current session, and not used
// before. Admitting it deletes the grant at the revision read, so of two
// logins with one token at most one gets in. The user may pull the one
// consumer the grant names, of one object's chunks, until the grant
// expires (bus.PermsArtifactReader).
func (a *Callout) authorizeArtifact(ctx context.Context, user, secret string) (grant, error) {
	nodeID, ok := bus.ParseArtifactUser(user)
	if !ok {
		return grant{}, &Refusal{User: user, Reason: "an artifact login's user is <node id>@artifact (bus.ArtifactUser), the id without dots, slashes or wildcards"}
	}
	if !schemas.TokenWellFormed(secret) {
		return grant{}, &Refusal{User: user, Reason: "not a warmfleet token; an artifact login presents the one-time token the control plane answered on wf.node.<id>.credentials.artifact"}
	}
	key := schemas.ArtifactGrantKey(secret)
	var g schemas.ArtifactGrant
	rev, err := bus.GetJSON(ctx, a.grantsKV, key, &g)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return grant{}, &Refusal{User: user, Reason: "not a current artifact login: each is good for one login before it expires; ask wf.node.<id>.credentials.artifact for a new one"}
	case err != nil:
		return grant{}, fmt.Errorf("read artifact grant: %w", err)
	case g.NodeID != nodeID:
		return grant{}, &Refusal{User: user, Reason: "this artifact login was minted for another node; log in as the user it was answered with"}
	case !a.now().Before(g.ExpiresAt):
		return grant{}, &Refusal{User: user, Reason: "this artifact login expired at " + g.ExpiresAt.UTC().Format(time.RFC3339) + "; ask for a new one"}
	case !bus.SubjectToken(g.Consumer):
		return grant{}, &Refusal{User: user, Reason: "this artifact login's grant names no consumer to read; ask wf.node.<id>.credentials.artifact for a new one"}
	}
	if err := a.grantSession(ctx, user, nodeID, g); err != nil {
		return grant{}, err
	}
	if err := a.grantsKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSequence(err) {
			return grant{}, &Refusal{User: user, Reason: "this artifact login was used already; each is good for one login"}
		}
		return grant{}, fmt.Errorf("use artifact grant: %w", err)
	}
	p := bus.PermsArtifactReader(nodeID, g.Consumer)
	return grant{kind: "artifact", name: user, perms: &p, expires: g.ExpiresAt}, nil
}

// grantSession refuses a grant minted for another session of the node
// than its current, unexpired one.
func (a *Callout) grantSession(ctx context.Context, user, nodeID string, g schemas.ArtifactGrant) error {
	var rec schemas.NodeRecord
	_, err := bus.GetJSON(ctx, a.nodesKV, nodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return &Refusal{User: user, Reason: "node " + nodeID + " is not enrolled"}
	case err != nil:
		return fmt.Errorf("read node %s: %w", nodeID, err)
	case rec.FencingToken != g.FencingToken:
		return &Refusal{User: user, Reason: fmt.Sprintf("this artifact login was minted for session %d of node %s, which is now at %d; the current session asks for a new one", g.FencingToken, nodeID, rec.FencingToken)}
	case !a.now().Before(rec.SessionExpires):
		return &Refusal{User: user, Reason: "node " + nodeID + "'s session expired; it asks for a new login once it has enrolled again"}
	}
	return nil
}

// isWrongLastSequence reports JetStream's answer to a write at a stale
// revision.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
