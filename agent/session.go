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

func (a *Agent) sessionPath() string { return filepath.Join(a.cfg.DataDir, "session.json") }

// loadSession returns the saved session token for this node and the
// generation it was granted under. A saved generation above the configured
// one is a later lifecycle cycle of the same machine: a rental that was
// stopped and resumed keeps its original bootstrap (configured generation)
// while the control plane moved the node to a new generation when the
// resumed agent re-enrolled, so the saved session is the newer truth. A
// saved generation below the configured one belongs to an earlier machine
// and is ignored: the bootstrap is for a fresh enrollment.
func (a *Agent) loadSession() (token string, generation uint64, ok bool) {
	b, err := os.ReadFile(a.sessionPath())
	if err != nil {
		return "", 0, false
	}
	var s savedSession
	if json.Unmarshal(b, &s) != nil || s.NodeID != a.cfg.NodeID || s.Generation < a.cfg.Generation || s.Generation == 0 || s.SessionToken == "" {
		return "", 0, false
	}
	return s.SessionToken, s.Generation, true
}

func (a *Agent) saveSession(e schemas.Enrollment) error {
	b, err := json.Marshal(savedSession{NodeID: e.NodeID, Generation: e.Generation, SessionToken: e.SessionToken, FencingToken: e.FencingToken})
	if err != nil {
		return err
	}
	tmp := a.sessionPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("agent: save session: %w", err)
	}
	return os.Rename(tmp, a.sessionPath())
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
		if err := a.request(ctx, bus.NodeRenew(a.cfg.NodeID), req, &rep); err != nil {
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

// request does one msgpack request/reply with a 5s timeout.
func (a *Agent) request(ctx context.Context, subject string, req, rep any) error {
	return a.requestWithin(ctx, 5*time.Second, subject, req, rep)
}

// requestWithin does one msgpack request/reply that waits up to timeout.
func (a *Agent) requestWithin(ctx context.Context, timeout time.Duration, subject string, req, rep any) error {
	b, err := codec.Encode(codec.MsgPack, req)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := a.conn.NC.RequestWithContext(rctx, subject, b)
	if err != nil {
		return err
	}
	return codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, rep)
}
