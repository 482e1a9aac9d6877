package nodes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// answerInvite mints a NodeBootstrap for wf.admin.node.invite.
func (s *Service) answerInvite(ctx context.Context, _ string, req schemas.InviteRequest) (schemas.NodeBootstrap, error) {
	return s.Invite(ctx, req)
}

// Invite mints a single-use enrollment token for req and stores its hash.
func (s *Service) Invite(ctx context.Context, req schemas.InviteRequest) (schemas.NodeBootstrap, error) {
	ttl := schemas.DefaultInviteTTL
	if req.TTLSeconds > 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	token := newToken()
	now := s.cfg.Now()
	inv := schemas.Invitation{NodeID: req.NodeID, RentalID: req.RentalID, Generation: req.Generation, AgentVersion: req.AgentVersion, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if _, err := bus.CreateJSON(ctx, s.enrollKV, schemas.InvitationKey(token), &inv); err != nil {
		return schemas.NodeBootstrap{}, fmt.Errorf("store invitation: %w", err)
	}
	s.log.Info("node invited", zap.String("node_id", req.NodeID), zap.String("rental_id", req.RentalID), zap.Uint64("generation", req.Generation), zap.Time("expires_at", inv.ExpiresAt))
	return schemas.NodeBootstrap{
		ControlPlaneURL: s.conn.NC.ConnectedUrlRedacted(), NodeID: req.NodeID, RentalID: req.RentalID, Generation: req.Generation,
		EnrollmentToken: token, ExpiresAt: inv.ExpiresAt, AgentVersion: req.AgentVersion,
		ControlPlaneCA: s.cfg.ControlPlaneCA,
	}, nil
}

// answerEnroll registers a node, logging the outcome.
func (s *Service) answerEnroll(ctx context.Context, _ string, req schemas.EnrollmentRequest) (schemas.Enrollment, error) {
	enr, err := s.enroll(ctx, req)
	if err != nil {
		ref := schemas.AsRefusal(err)
		s.log.Warn("enrollment refused", zap.String("node_id", req.NodeID), zap.String("code", string(ref.Code)), zap.String("reason", ref.Reason))
		return enr, ref
	}
	s.log.Info("node enrolled", zap.String("node_id", enr.NodeID), zap.Uint64("fencing_token", enr.FencingToken), zap.Bool("duplicate", enr.Duplicate))
	return enr, nil
}

// enroll admits a node with one of three credentials: an invitation's
// enrollment token (redeemed once), the node's current session token (an
// agent resuming after a restart: Duplicate), or none when open enrollment
// is configured. Every success raises the fencing token by CAS, so whatever
// process held the previous session can no longer act.
func (s *Service) enroll(ctx context.Context, req schemas.EnrollmentRequest) (schemas.Enrollment, error) {
	// One node's enrollments are ordered; other nodes' proceed alongside.
	// The node record's CAS below still arbitrates between replicas.
	unlock := s.enrollLocks.Lock(req.NodeID)
	defer unlock()
	now := s.cfg.Now()
	rec := schemas.NodeRecord{NodeID: req.NodeID}
	rev, err := bus.GetJSON(ctx, s.nodesKV, req.NodeID, &rec)
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
	if req.Generation, err = s.checkCredential(ctx, req, rec, known, now); err != nil {
		return schemas.Enrollment{}, err
	}
	session := newToken()
	duplicate := known && req.Generation == rec.Generation
	rec, err = s.register(ctx, req, rec, known, session, now)
	if err != nil {
		return schemas.Enrollment{}, err
	}
	s.poke()
	return schemas.Enrollment{
		NodeID: req.NodeID, SessionToken: session, SessionExpires: rec.SessionExpires,
		FencingToken: rec.FencingToken, Generation: rec.Generation, LeaseExpires: rec.LeaseExpires,
		HeartbeatSeconds: max(int64(s.cfg.HeartbeatInterval/time.Second), 1), Consumer: bus.NodeConsumer(req.NodeID),
		Duplicate: duplicate,
	}, nil
}

// checkCredential checks the request's credential against the node's
// record rec (known: it exists) and answers the generation the node
// enrolls under: the request's, or, for a session whose stopped rental was
// resumed, the rental's next.
func (s *Service) checkCredential(ctx context.Context, req schemas.EnrollmentRequest, rec schemas.NodeRecord, known bool, now time.Time) (uint64, error) {
	tok := req.EnrollmentToken
	switch {
	case tok == "":
		if !s.cfg.OpenEnrollment {
			return 0, &schemas.Refusal{Code: schemas.CodeTokenRequired, Field: "enrollment_token",
				Reason: "this control plane admits only invited nodes; mint a bootstrap with `warmfleet node invite`"}
		}
	case !schemas.TokenWellFormed(tok):
		return 0, &schemas.Refusal{Code: schemas.CodeTokenMalformed, Field: "enrollment_token",
			Reason: "not a warmfleet token (43 base64url characters); use the bootstrap file as minted"}
	case known && rec.SessionTokenHash == schemas.TokenHash(tok):
		if req.Generation != rec.Generation {
			return 0, &schemas.Refusal{Code: schemas.CodeStaleGeneration, Field: "generation", Reason: "a session resumes only within its generation; re-invite the node"}
		}
		if g := s.resumeGeneration(ctx, req, rec); g > 0 {
			return g, nil // its rental was resumed from stopped: the node's next cycle
		}
		if !now.Before(rec.SessionExpires) {
			return 0, &schemas.Refusal{Code: schemas.CodeSessionExpired, Field: "enrollment_token", Reason: "the session expired; re-invite the node"}
		}
	default:
		if err := s.redeem(ctx, tok, req, now); err != nil {
			return 0, err
		}
	}
	return req.Generation, nil
}

// register writes the node's new session into its record rec (known: it
// exists), after its command consumer exists, and returns the record as
// written. The credential was checked against rec; other writers (facts,
// lost ↔ ready, drain) may change the record before the write and are
// retried over, but another enrollment — a new fencing token or
// generation — means this one must not act.
func (s *Service) register(ctx context.Context, req schemas.EnrollmentRequest, rec schemas.NodeRecord, known bool, session string, now time.Time) (schemas.NodeRecord, error) {
	price, spot := s.rentalTerms(ctx, req)
	facts := req.Facts
	facts.Normalize()
	seenToken, seenGen := rec.FencingToken, rec.Generation
	admit := func(n *schemas.NodeRecord) error {
		if n.FencingToken != seenToken || n.Generation != seenGen {
			return fmt.Errorf("node %s enrolled concurrently (fencing token %d → %d)", req.NodeID, seenToken, n.FencingToken)
		}
		n.RentalID, n.Generation = req.RentalID, req.Generation
		n.FencingToken++
		n.SessionTokenHash, n.SessionExpires = schemas.TokenHash(session), now.Add(s.cfg.SessionTTL)
		n.State, n.EnrolledAt, n.LeaseExpires = schemas.NodeReady, now, now.Add(s.LeaseTTL())
		n.AgentVersion, n.Capacity, n.MaxWorkloads, n.PricePerHour = req.AgentVersion, req.Capacity, req.MaxWorkloads, price
		n.Facts, n.FactsReceivedAt = &facts, now
		n.Interruptible, n.Interruption = spot, nil
		return nil
	}
	// The consumer exists before the record says the node is ready, so no
	// command is published for a node that cannot read it.
	if _, err := s.conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamCmds, bus.NodeConsumerConfig(req.NodeID, s.cfg.CommandAckWait)); err != nil {
		return rec, fmt.Errorf("create command consumer for %s: %w", req.NodeID, err)
	}
	var rev uint64
	var err error
	if !known {
		_ = admit(&rec)
		rev, err = bus.CreateJSON(ctx, s.nodesKV, req.NodeID, &rec)
	} else {
		rec, rev, err = bus.UpdateJSON(ctx, s.nodesKV, req.NodeID, admit)
	}
	if err != nil {
		// A concurrent enrollment (another replica) won; this one must not
		// act.
		return rec, fmt.Errorf("register node %s: %w", req.NodeID, err)
	}
	s.cache.NoteNode(rec, rev)
	return rec, nil
}

// rentalTerms are what the node costs an hour (what it declares, or,
// rented with a capacity provider configured, what its rental does) and
// whether it is interruptible (its rental is spot capacity).
func (s *Service) rentalTerms(ctx context.Context, req schemas.EnrollmentRequest) (float64, bool) {
	if req.RentalID != "" && s.cfg.RentedPrices {
		var rt schemas.Rental
		if _, err := bus.GetJSON(ctx, s.rentalsKV, req.RentalID, &rt); err == nil {
			if rt.PricePerHour > 0 {
				return rt.PricePerHour, rt.Interruptible
			}
			return req.PricePerHour, rt.Interruptible
		}
	}
	return req.PricePerHour, false
}

// redeem checks an invitation against the request and deletes it at the
// revision it was read at: of two concurrent redemptions one fails.
func (s *Service) redeem(ctx context.Context, tok string, req schemas.EnrollmentRequest, now time.Time) error {
	key := schemas.InvitationKey(tok)
	var inv schemas.Invitation
	rev, err := bus.GetJSON(ctx, s.enrollKV, key, &inv)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &schemas.Refusal{Code: schemas.CodeTokenUnknown, Field: "enrollment_token",
			Reason: "unknown or already used; an enrollment token works once — mint a new one with `warmfleet node invite`"}
	}
	if err != nil {
		return err
	}
	switch {
	case !now.Before(inv.ExpiresAt):
		_ = s.enrollKV.Delete(ctx, key, jetstream.LastRevision(rev))
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
	if err := s.enrollKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return &schemas.Refusal{Code: schemas.CodeTokenUnknown, Field: "enrollment_token", Reason: "already used by a concurrent enrollment"}
		}
		return fmt.Errorf("redeem invitation: %w", err)
	}
	return nil
}

// renew extends a session. It never moves the fencing token; a renewal
// from a superseded session, or published on another node's subject, is
// refused.
func (s *Service) renew(ctx context.Context, subject string, req schemas.SessionRenewal) (schemas.SessionRenewal, error) {
	if bus.SubjectNode(subject) != req.NodeID {
		return schemas.SessionRenewal{}, &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "renewal published on another node's subject"}
	}
	now := s.cfg.Now()
	rec, rev, err := bus.UpdateJSON(ctx, s.nodesKV, req.NodeID, func(n *schemas.NodeRecord) error {
		switch {
		case n.FencingToken != req.FencingToken:
			return &schemas.Refusal{Code: schemas.CodeSuperseded, Field: "fencing_token", Reason: "a newer session of this node exists; this process must stop"}
		case n.SessionTokenHash != schemas.TokenHash(req.SessionToken):
			return &schemas.Refusal{Code: schemas.CodeSessionInvalid, Field: "session_token", Reason: "not this node's session"}
		case !now.Before(n.SessionExpires):
			return &schemas.Refusal{Code: schemas.CodeSessionExpired, Field: "session_token", Reason: "the session expired; re-invite the node"}
		}
		n.SessionExpires = now.Add(s.cfg.SessionTTL)
		return nil
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.SessionRenewal{}, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "node_id", Reason: "not enrolled"}
	}
	if err != nil {
		return schemas.SessionRenewal{}, err
	}
	s.cache.NoteNode(rec, rev)
	return schemas.SessionRenewal{NodeID: rec.NodeID, SessionExpires: rec.SessionExpires, FencingToken: rec.FencingToken}, nil
}

// resumeGeneration is enrollment's question to the rentals: an agent
// presenting the session of its node's current generation, whose rental
// was resumed from stopped since, is that machine coming back, and its node
// moves to the rental's generation. It answers 0 otherwise. The session may
// have expired while the machine was stopped: the resume itself is the
// authority, and it holds only for the node its rental names, only while
// that resume is under way.
func (s *Service) resumeGeneration(ctx context.Context, req schemas.EnrollmentRequest, rec schemas.NodeRecord) uint64 {
	if s.rentalsKV == nil || req.RentalID == "" || rec.RentalID != req.RentalID || req.Generation != rec.Generation {
		return 0
	}
	var rt schemas.Rental
	if _, err := bus.GetJSON(ctx, s.rentalsKV, rec.RentalID, &rt); err != nil {
		return 0
	}
	g := rt.Resumes(rec)
	if g > 0 {
		s.log.Info("a resumed rental's node re-enrolls under a new generation", zap.String("node_id", req.NodeID),
			zap.String("rental_id", rec.RentalID), zap.Uint64("from", rec.Generation), zap.Uint64("to", g))
	}
	return g
}

// newToken mints an enrollment or session token: 32 random bytes.
func newToken() string { return randid.Token(32) }
