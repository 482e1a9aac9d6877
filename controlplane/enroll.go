package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultInviteTTL is how long an enrollment token is good for.
const DefaultInviteTTL = 15 * time.Minute

// handleInvite mints a NodeBootstrap: a single-use enrollment token whose
// hash (never the token) is stored in wf_enroll.
func (cp *ControlPlane) handleInvite(ctx context.Context, m *nats.Msg) {
	var req schemas.InviteRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.NodeBootstrap]{Refusal: refusalOf(err, "body is not an InviteRequest")})
		return
	}
	boot, err := cp.invite(ctx, req)
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.NodeBootstrap]{Refusal: schemas.AsRefusal(err)})
		return
	}
	cp.reply(m, enc, schemas.Reply[schemas.NodeBootstrap]{OK: &boot})
}

// invite mints a single-use enrollment token for req and stores its hash.
func (cp *ControlPlane) invite(ctx context.Context, req schemas.InviteRequest) (schemas.NodeBootstrap, error) {
	ttl := DefaultInviteTTL
	if req.TTLSeconds > 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	token := newToken()
	now := cp.now()
	inv := schemas.Invitation{NodeID: req.NodeID, RentalID: req.RentalID, Generation: req.Generation, AgentVersion: req.AgentVersion, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if _, err := bus.CreateJSON(ctx, cp.enrollKV, inviteKey(token), &inv); err != nil {
		return schemas.NodeBootstrap{}, fmt.Errorf("store invitation: %w", err)
	}
	cp.log.Info("node invited", zap.String("node_id", req.NodeID), zap.String("rental_id", req.RentalID), zap.Uint64("generation", req.Generation), zap.Time("expires_at", inv.ExpiresAt))
	return schemas.NodeBootstrap{
		ControlPlaneURL: cp.conn.NC.ConnectedUrlRedacted(), NodeID: req.NodeID, RentalID: req.RentalID, Generation: req.Generation,
		EnrollmentToken: token, ExpiresAt: inv.ExpiresAt, AgentVersion: req.AgentVersion,
	}, nil
}

// handleEnroll registers a node and answers in the request's encoding.
func (cp *ControlPlane) handleEnroll(ctx context.Context, m *nats.Msg) {
	var req schemas.EnrollmentRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{Refusal: refusalOf(err, "body is not an EnrollmentRequest")})
		return
	}
	enr, err := cp.enroll(ctx, req)
	if err != nil {
		ref := schemas.AsRefusal(err)
		cp.log.Warn("enrollment refused", zap.String("node_id", req.NodeID), zap.String("code", string(ref.Code)), zap.String("reason", ref.Reason))
		cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{Refusal: ref})
		return
	}
	cp.log.Info("node enrolled", zap.String("node_id", enr.NodeID), zap.Uint64("fencing_token", enr.FencingToken), zap.Bool("duplicate", enr.Duplicate))
	cp.reply(m, enc, schemas.Reply[schemas.Enrollment]{OK: &enr})
}

// enroll admits a node with one of three credentials: an invitation's
// enrollment token (redeemed once), the node's current session token (an
// agent resuming after a restart: Duplicate), or none when open enrollment
// is configured. Every success raises the fencing token by CAS, so whatever
// process held the previous session can no longer act.
func (cp *ControlPlane) enroll(ctx context.Context, req schemas.EnrollmentRequest) (schemas.Enrollment, error) {
	// One node's enrollments are ordered; other nodes' proceed alongside.
	// The node record's CAS below still arbitrates between replicas.
	unlock := cp.enrollLocks.Lock(req.NodeID)
	defer unlock()
	now := cp.now()
	rec := schemas.NodeRecord{NodeID: req.NodeID}
	rev, err := bus.GetJSON(ctx, cp.nodesKV, req.NodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev = 0
	case err != nil:
		return schemas.Enrollment{}, err
	}
	known := rev != 0
	if known && req.Generation < rec.Generation {
		return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeStaleGeneration, Field: "generation",
			Reason: fmt.Sprintf("node %s is at generation %d; this agent's bootstrap is older — re-invite the node", req.NodeID, rec.Generation)}
	}
	tok := req.EnrollmentToken
	switch {
	case tok == "":
		if !cp.cfg.OpenEnrollment {
			return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeTokenRequired, Field: "enrollment_token",
				Reason: "this control plane admits only invited nodes; mint a bootstrap with `warmfleet node invite`"}
		}
	case !tokenWellFormed(tok):
		return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeTokenMalformed, Field: "enrollment_token",
			Reason: "not a warmfleet token (43 base64url characters); use the bootstrap file as minted"}
	case known && rec.SessionTokenHash == hashToken(tok):
		if req.Generation != rec.Generation {
			return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeStaleGeneration, Field: "generation", Reason: "a session resumes only within its generation; re-invite the node"}
		}
		if g := cp.resumeGeneration(ctx, req, rec); g > 0 {
			req.Generation = g // its rental was resumed from stopped: the node's next cycle
			break
		}
		if !now.Before(rec.SessionExpires) {
			return schemas.Enrollment{}, &schemas.Refusal{Code: schemas.CodeSessionExpired, Field: "enrollment_token", Reason: "the session expired; re-invite the node"}
		}
	default:
		if err := cp.redeem(ctx, tok, req, now); err != nil {
			return schemas.Enrollment{}, err
		}
	}
	session := newToken()
	duplicate := known && req.Generation == rec.Generation
	price := req.PricePerHour
	if req.RentalID != "" && cp.cfg.Capacity != nil {
		// A rented node costs what its rental does.
		var rt schemas.Rental
		if _, err := bus.GetJSON(ctx, cp.rentalsKV, req.RentalID, &rt); err == nil && rt.PricePerHour > 0 {
			price = rt.PricePerHour
		}
	}
	facts := req.Facts
	facts.Normalize()
	// The credential was checked against the session read above; other
	// writers (facts, lost ↔ ready, drain) may change the record before the
	// write and are retried over, but another enrollment — a new fencing
	// token or generation — means this one must not act.
	seenToken, seenGen := rec.FencingToken, rec.Generation
	admit := func(n *schemas.NodeRecord) error {
		if n.FencingToken != seenToken || n.Generation != seenGen {
			return fmt.Errorf("node %s enrolled concurrently (fencing token %d → %d)", req.NodeID, seenToken, n.FencingToken)
		}
		n.RentalID, n.Generation = req.RentalID, req.Generation
		n.FencingToken++
		n.SessionTokenHash, n.SessionExpires = hashToken(session), now.Add(cp.cfg.SessionTTL)
		n.State, n.EnrolledAt, n.LeaseExpires = schemas.NodeReady, now, now.Add(cp.leaseTTL())
		n.AgentVersion, n.Capacity, n.MaxWorkloads, n.PricePerHour = req.AgentVersion, req.Capacity, req.MaxWorkloads, price
		n.Facts, n.FactsReceivedAt = &facts, now
		return nil
	}
	// The consumer exists before the record says the node is ready, so no
	// command is published for a node that cannot read it.
	if _, err := cp.conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamCmds, bus.NodeConsumerConfig(req.NodeID, cp.cfg.CommandAckWait)); err != nil {
		return schemas.Enrollment{}, fmt.Errorf("create command consumer for %s: %w", req.NodeID, err)
	}
	var nrev uint64
	if !known {
		_ = admit(&rec)
		nrev, err = bus.CreateJSON(ctx, cp.nodesKV, req.NodeID, &rec)
	} else {
		rec, nrev, err = bus.UpdateJSON(ctx, cp.nodesKV, req.NodeID, admit)
	}
	if err != nil {
		// A concurrent enrollment (another replica) won; this one must not
		// act.
		return schemas.Enrollment{}, fmt.Errorf("register node %s: %w", req.NodeID, err)
	}
	cp.cache.applyNodeRecord(rec, nrev)
	cp.poke()
	return schemas.Enrollment{
		NodeID: req.NodeID, SessionToken: session, SessionExpires: rec.SessionExpires,
		FencingToken: rec.FencingToken, Generation: rec.Generation, LeaseExpires: rec.LeaseExpires,
		HeartbeatSeconds: max(int64(cp.cfg.HeartbeatInterval/time.Second), 1), Consumer: bus.NodeConsumer(req.NodeID),
		Duplicate: duplicate,
	}, nil
}

// redeem checks an invitation against the request and deletes it at the
// revision it was read at: of two concurrent redemptions one fails.
func (cp *ControlPlane) redeem(ctx context.Context, tok string, req schemas.EnrollmentRequest, now time.Time) error {
	key := inviteKey(tok)
	var inv schemas.Invitation
	rev, err := bus.GetJSON(ctx, cp.enrollKV, key, &inv)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &schemas.Refusal{Code: schemas.CodeTokenUnknown, Field: "enrollment_token",
			Reason: "unknown or already used; an enrollment token works once — mint a new one with `warmfleet node invite`"}
	}
	if err != nil {
		return err
	}
	switch {
	case !now.Before(inv.ExpiresAt):
		_ = cp.enrollKV.Delete(ctx, key, jetstream.LastRevision(rev))
		return &schemas.Refusal{Code: schemas.CodeTokenExpired, Field: "enrollment_token",
			Reason: "expired at " + inv.ExpiresAt.UTC().Format(time.RFC3339) + "; mint a new one with `warmfleet node invite`"}
	case inv.NodeID != req.NodeID:
		return &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "this token was minted for another node"}
	case inv.Generation != req.Generation:
		return &schemas.Refusal{Code: schemas.CodeStaleGeneration, Field: "generation",
			Reason: fmt.Sprintf("this token is for generation %d, the agent asked for %d", inv.Generation, req.Generation)}
	case inv.RentalID != req.RentalID:
		return &schemas.Refusal{Code: schemas.CodeWrongRental, Field: "rental_id", Reason: "this token was minted for another rental"}
	}
	if err := cp.enrollKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return &schemas.Refusal{Code: schemas.CodeTokenUnknown, Field: "enrollment_token", Reason: "already used by a concurrent enrollment"}
		}
		return fmt.Errorf("redeem invitation: %w", err)
	}
	return nil
}

// handleRenew extends a session. It never moves the fencing token; a
// renewal from a superseded session is refused.
func (cp *ControlPlane) handleRenew(ctx context.Context, m *nats.Msg) {
	var req schemas.SessionRenewal
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil && subjectNode(m.Subject) != req.NodeID {
		err = &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "renewal published on another node's subject"}
	}
	if err != nil {
		cp.reply(m, enc, schemas.Reply[schemas.SessionRenewal]{Refusal: refusalOf(err, "body is not a SessionRenewal")})
		return
	}
	now := cp.now()
	rec, rev, err := bus.UpdateJSON(ctx, cp.nodesKV, req.NodeID, func(n *schemas.NodeRecord) error {
		switch {
		case n.FencingToken != req.FencingToken:
			return &schemas.Refusal{Code: schemas.CodeSuperseded, Field: "fencing_token", Reason: "a newer session of this node exists; this process must stop"}
		case n.SessionTokenHash != hashToken(req.SessionToken):
			return &schemas.Refusal{Code: schemas.CodeSessionInvalid, Field: "session_token", Reason: "not this node's session"}
		case !now.Before(n.SessionExpires):
			return &schemas.Refusal{Code: schemas.CodeSessionExpired, Field: "session_token", Reason: "the session expired; re-invite the node"}
		}
		n.SessionExpires = now.Add(cp.cfg.SessionTTL)
		return nil
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "node_id", Reason: "not enrolled"}
		}
		cp.reply(m, enc, schemas.Reply[schemas.SessionRenewal]{Refusal: schemas.AsRefusal(err)})
		return
	}
	cp.cache.applyNodeRecord(rec, rev)
	cp.reply(m, enc, schemas.Reply[schemas.SessionRenewal]{OK: &schemas.SessionRenewal{NodeID: rec.NodeID, SessionExpires: rec.SessionExpires, FencingToken: rec.FencingToken}})
}

// refusalOf turns a decode or validation error into a refusal that does not
// echo the input.
func refusalOf(err error, what string) *schemas.Refusal {
	if errors.Is(err, codec.ErrUnknownField) {
		return &schemas.Refusal{Code: schemas.CodeUnknownField, Reason: what + ": it has a field this control plane does not know"}
	}
	if errors.Is(err, codec.ErrMalformed) {
		return &schemas.Refusal{Code: schemas.CodeMalformed, Reason: what}
	}
	return schemas.AsRefusal(err)
}

// newToken mints an invitation or session token (tokenWellFormed's shape).
func newToken() string { return randid.Token(32) }

func tokenWellFormed(t string) bool {
	b, err := base64.RawURLEncoding.DecodeString(t)
	return err == nil && len(b) == 32
}

// hashToken is how tokens are stored: never the token itself.
func hashToken(t string) string {
	s := sha256.Sum256([]byte(t))
	return "sha256:" + hex.EncodeToString(s[:])
}

// inviteKey is the wf_enroll key of a token.
func inviteKey(t string) string {
	s := sha256.Sum256([]byte(t))
	return hex.EncodeToString(s[:])
}
