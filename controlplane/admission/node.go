package admission

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// authorizeNode admits an agent: by its session token once it has
// enrolled, else by its invitation, which is checked and left for
// enrollment to redeem.
func (a *Callout) authorizeNode(ctx context.Context, user, secret, h string) (grant, error) {
	if !schemas.TokenWellFormed(secret) {
		return grant{}, &Refusal{User: user, Reason: "unknown user, or a secret that is not a warmfleet token; agents present their bootstrap's enrollment token or their session token, producers a name listed in --producer-tokens-file"}
	}
	if user != "" {
		rec, ok, err := a.nodeSession(ctx, user, h)
		if err != nil {
			return grant{}, err
		}
		if ok {
			return a.sessionGrant(ctx, user, rec)
		}
	}
	var inv schemas.Invitation
	_, err := bus.GetJSON(ctx, a.enrollKV, schemas.InvitationKey(secret), &inv)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return grant{}, &Refusal{User: user, Reason: "not a current invitation or session of this node: an invitation works until the node enrolls with it, " +
			"then the agent logs in with its session token (kept in its data dir); mint a new bootstrap with `warmfleet node invite`"}
	case err != nil:
		return grant{}, fmt.Errorf("read invitation: %w", err)
	case !a.now().Before(inv.ExpiresAt):
		return grant{}, &Refusal{User: user, Reason: "the invitation expired at " + inv.ExpiresAt.UTC().Format(time.RFC3339) + "; mint a new one with `warmfleet node invite`"}
	case user != "" && user != inv.NodeID:
		return grant{}, &Refusal{User: user, Reason: "this invitation was minted for another node; use the bootstrap file as minted"}
	case !bus.SubjectToken(inv.NodeID):
		return grant{}, &Refusal{User: user, Reason: "a node id used with NATS auth must not contain dots or wildcards; invite the node under another id"}
	}
	p := bus.PermsEnrolling(inv.NodeID, bus.EnrollingInboxPrefix(inv.NodeID, secret))
	return grant{kind: "enrolling", name: inv.NodeID, perms: &p, expires: inv.ExpiresAt}, nil
}

// sessionGrant is what node user's current session may do: everything a
// node may while it is live; once it expired, only enroll again, and only
// while its stopped rental is being resumed (controlplane/rentals), after
// which the agent logs in with its new session.
func (a *Callout) sessionGrant(ctx context.Context, user string, rec schemas.NodeRecord) (grant, error) {
	if !a.now().Before(rec.SessionExpires) && bus.SubjectToken(user) && a.resumeUnderWay(ctx, rec) {
		p := bus.PermsEnrolling(user, bus.NodeInboxes(user)...)
		return grant{kind: "enrolling", name: user, perms: &p, expires: a.now().Add(schemas.DefaultInviteTTL)}, nil
	}
	if err := a.sessionRefusal(user, user, rec); err != nil {
		return grant{}, err
	}
	p := bus.PermsNode(user)
	return grant{kind: "node", name: user, perms: &p, expires: rec.SessionExpires}, nil
}

// resumeUnderWay reports whether rec's rental is being resumed into a new
// generation of the node (schemas.Rental.Resumes).
func (a *Callout) resumeUnderWay(ctx context.Context, rec schemas.NodeRecord) bool {
	if rec.RentalID == "" {
		return false
	}
	var rt schemas.Rental
	if _, err := bus.GetJSON(ctx, a.rentalsKV, rec.RentalID, &rt); err != nil {
		return false
	}
	return rt.Resumes(rec) > 0
}

// nodeSession reads nodeID's wf_nodes record and reports whether h is the
// hash of its session token, expired or not. No record is not an error.
func (a *Callout) nodeSession(ctx context.Context, nodeID, h string) (schemas.NodeRecord, bool, error) {
	var rec schemas.NodeRecord
	_, err := bus.GetJSON(ctx, a.nodesKV, nodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey):
		return rec, false, nil
	case err != nil:
		return rec, false, fmt.Errorf("read node %s: %w", nodeID, err)
	}
	return rec, rec.SessionTokenHash != "" && subtle.ConstantTimeCompare([]byte(rec.SessionTokenHash), []byte(h)) == 1, nil
}

// sessionRefusal says why node nodeID's matching session cannot log in
// (as user) now: it expired, or the id cannot be a subject token. Nil when
// it can.
func (a *Callout) sessionRefusal(user, nodeID string, rec schemas.NodeRecord) error {
	if !a.now().Before(rec.SessionExpires) {
		return &Refusal{User: user, Reason: "this node's session expired at " + rec.SessionExpires.UTC().Format(time.RFC3339) +
			"; re-invite the node (`warmfleet node invite`) and restart the agent with the new bootstrap"}
	}
	if !bus.SubjectToken(nodeID) {
		return &Refusal{User: user, Reason: "a node id used with NATS auth must not contain dots or wildcards; re-invite the node under another id"}
	}
	return nil
}
