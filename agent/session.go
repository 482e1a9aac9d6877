package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrSuperseded is returned by Run when a newer session of this node exists:
// this process must not act again. Restarting it resumes only if its
// session is still the current one.
var ErrSuperseded = errors.New("agent: superseded by a newer session of this node")

// savedSession is what the agent keeps on disk to resume after a restart.
// It holds a secret (the session token) and is written 0600.
type savedSession struct {
	NodeID       string `json:"node_id"`
	Generation   uint64 `json:"generation"`
	SessionToken string `json:"session_token"`
	FencingToken uint64 `json:"fencing_token"`
}

func sessionPath(dataDir string) string { return filepath.Join(dataDir, "session.json") }

// loadSession returns the saved session token for cfg's node and the
// generation it was granted under. A saved generation above the configured
// one is a later lifecycle cycle of the same machine: a rental that was
// stopped and resumed keeps its original bootstrap (configured generation)
// while the control plane moved the node to a new generation when the
// resumed agent re-enrolled, so the saved session is the newer truth. A
// saved generation below the configured one belongs to an earlier machine
// and is ignored: the bootstrap is for a fresh enrollment.
func loadSession(cfg Config) (token string, generation uint64, ok bool) {
	b, err := os.ReadFile(sessionPath(cfg.DataDir))
	if err != nil {
		return "", 0, false
	}
	var s savedSession
	if json.Unmarshal(b, &s) != nil || s.NodeID != cfg.NodeID || s.Generation < cfg.Generation || s.Generation == 0 || s.SessionToken == "" {
		return "", 0, false
	}
	return s.SessionToken, s.Generation, true
}

func saveSession(dataDir string, e schemas.Enrollment) error {
	b, err := json.Marshal(savedSession{NodeID: e.NodeID, Generation: e.Generation, SessionToken: e.SessionToken, FencingToken: e.FencingToken})
	if err != nil {
		return err
	}
	tmp := sessionPath(dataDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("agent: save session: %w", err)
	}
	return os.Rename(tmp, sessionPath(dataDir))
}

// capacityOf is what the node offers: what the configuration says, its
// unset fields from facts.
func capacityOf(c schemas.Resources, facts schemas.NodeFacts) schemas.Resources {
	if c.CPUMillis == 0 {
		c.CPUMillis = facts.Host.CPUMillis
	}
	if c.MemoryBytes == 0 {
		c.MemoryBytes = facts.Host.MemoryBytes
	}
	if c.GPUCount == 0 {
		c.GPUCount = facts.Host.Accelerator.GPUCount()
	}
	return c
}

// enroll asks the control plane for a session, retrying until it answers:
// a core request has no redelivery, and an agent started before its control
// plane must wait for it.
func (a *Agent) enroll(ctx context.Context, facts schemas.NodeFacts) (schemas.Enrollment, error) {
	token, generation, resuming := loadSession(a.cfg)
	if !resuming {
		token, generation = a.cfg.EnrollmentToken, a.cfg.Generation
	}
	if err := a.login(ctx, token, resuming && a.cfg.EnrollmentToken != ""); err != nil {
		if !errors.Is(err, ErrLoginRefused) {
			return schemas.Enrollment{}, err
		}
		// NATS refuses the saved session (expired, or superseded by another
		// enrollment); the bootstrap token may still admit the node.
		a.log.Info("NATS refused the saved session; logging in with the bootstrap token")
		resuming, token, generation = false, a.cfg.EnrollmentToken, a.cfg.Generation
		if err := a.login(ctx, token, false); err != nil {
			return schemas.Enrollment{}, err
		}
	}
	req := schemas.EnrollmentRequest{
		NodeID: a.cfg.NodeID, RentalID: a.cfg.RentalID, Generation: generation,
		EnrollmentToken: token, AgentVersion: Version,
		Capacity: capacityOf(a.cfg.Capacity, facts), MaxWorkloads: a.cfg.MaxWorkloads, Facts: facts,
	}
	wait := 250 * time.Millisecond
	for {
		var rep schemas.Reply[schemas.Enrollment]
		err := a.req.Request(ctx, requestTimeout, bus.SubjectEnroll, req, &rep)
		if err == nil {
			if rep.Refusal != nil && resuming && a.cfg.EnrollmentToken != "" {
				// The saved session is gone (expired, superseded); a fresh
				// bootstrap token admits the node anew.
				a.log.Info("saved session refused; enrolling with the bootstrap token", zap.String("code", string(rep.Refusal.Code)))
				resuming, req.EnrollmentToken, req.Generation = false, a.cfg.EnrollmentToken, a.cfg.Generation
				if err := a.login(ctx, req.EnrollmentToken, false); err != nil {
					return schemas.Enrollment{}, err
				}
				continue
			}
			if rep.Refusal != nil {
				return schemas.Enrollment{}, fmt.Errorf("agent: enrollment refused (resuming a saved session: %v): %w", resuming, rep.Refusal)
			}
			if rep.OK == nil {
				return schemas.Enrollment{}, errors.New("agent: enrollment reply carried neither a session nor a refusal")
			}
			if err := saveSession(a.cfg.DataDir, *rep.OK); err != nil {
				return schemas.Enrollment{}, err
			}
			// From here on the connection acts as the enrolled node.
			if err := a.login(ctx, rep.OK.SessionToken, false); err != nil {
				return schemas.Enrollment{}, err
			}
			a.mu.Lock()
			a.enr = *rep.OK
			a.mu.Unlock()
			return *rep.OK, nil
		}
		if errors.Is(err, codec.ErrMalformed) {
			return schemas.Enrollment{}, fmt.Errorf("agent: enrollment reply: %w", err)
		}
		a.log.Info("control plane not answering enrollment yet", zap.Error(err))
		select {
		case <-ctx.Done():
			return schemas.Enrollment{}, fmt.Errorf("agent: enroll: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// renewLoop renews the session when a third of its life is left. A refusal
// that says this session is no longer the node's ends the agent.
func (a *Agent) renewLoop(ctx context.Context, supersede func(error)) {
	for {
		enr := a.Enrollment()
		left := time.Until(enr.SessionExpires)
		wait := left - left/3
		if wait < time.Second {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		req := schemas.SessionRenewal{NodeID: a.cfg.NodeID, SessionToken: enr.SessionToken, FencingToken: enr.FencingToken}
		var rep schemas.Reply[schemas.SessionRenewal]
		if err := a.req.Request(ctx, requestTimeout, bus.NodeRenew(a.cfg.NodeID), req, &rep); err != nil {
			a.log.Warn("session renewal not answered; will retry", zap.Error(err))
			continue
		}
		if rep.Refusal != nil {
			switch rep.Refusal.Code {
			case schemas.CodeSuperseded, schemas.CodeSessionInvalid, schemas.CodeSessionExpired, schemas.CodeUnknownNode:
				supersede(fmt.Errorf("%w: renewal refused: %w", ErrSuperseded, rep.Refusal))
				return
			}
			a.log.Warn("session renewal refused", zap.String("code", string(rep.Refusal.Code)), zap.String("reason", rep.Refusal.Reason))
			continue
		}
		if rep.OK != nil {
			a.mu.Lock()
			a.enr.SessionExpires = rep.OK.SessionExpires
			a.mu.Unlock()
			a.log.Debug("session renewed", zap.Time("expires", rep.OK.SessionExpires))
		}
	}
}
