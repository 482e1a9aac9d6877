package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
)

// ErrLoginRefused is returned when NATS keeps refusing the agent's login
// with a saved session token (the session expired or was superseded).
var ErrLoginRefused = errors.New("agent: NATS refused this agent's login")

// savedSessionPatience is how long a refused login with a saved session is
// retried before the agent falls back to its bootstrap token: long enough
// for a control plane that is starting to answer the callout.
const savedSessionPatience = 10 * time.Second

// login makes the connection present secret (with NATS auth on) and waits
// until it is connected again. With giveUp, a login NATS keeps refusing
// ends in ErrLoginRefused after savedSessionPatience; without it, login
// waits until ctx ends, saying every 15s what is wrong and what to do: the
// refusal may be passing (the control plane, which authorizes logins, is
// not up yet). The secret is never logged.
func (a *Agent) login(ctx context.Context, secret string, giveUp bool) error {
	c := a.cfg.Credentials
	if c == nil {
		return nil
	}
	if secret == "" {
		return fmt.Errorf("%w: NATS auth is on but the agent has no token: start it with --bootstrap <file from `warmfleet node invite`>", ErrLoginRefused)
	}
	if c.Secret() != secret {
		c.SetSecret(secret)
		if err := a.conn.NC.ForceReconnect(); err != nil {
			return fmt.Errorf("agent: reconnect to NATS with new credentials: %w", err)
		}
	}
	start, lastHint := time.Now(), time.Now()
	for !a.conn.NC.IsConnected() {
		refused := bus.IsAuthError(a.conn.NC.LastError())
		if refused && giveUp && time.Since(start) > savedSessionPatience {
			return fmt.Errorf("%w as node %s with its saved session", ErrLoginRefused, c.User())
		}
		if time.Since(lastHint) > 15*time.Second {
			lastHint = time.Now()
			if refused {
				a.log.Warn("NATS refuses this agent's login; if this persists the bootstrap's invitation was already used or expired, "+
					"or the control plane (which authorizes logins) is down: mint a new bootstrap with `warmfleet node invite`",
					zap.String("as", c.User()), zap.Duration("waited", time.Since(start).Round(time.Second)))
			} else {
				a.log.Info("waiting for the NATS connection", zap.Error(a.conn.NC.LastError()))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent: log in to NATS: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// LoginSecret is the secret an agent configured by cfg (NodeID,
// Generation, DataDir, EnrollmentToken) logs in to NATS with first: its
// saved session when it has one, else its bootstrap token. Building the
// connection's Credentials with it spares a restarted agent a refused first
// login with its already-redeemed bootstrap token. Those Credentials
// (bus.AgentCredentials) take the bootstrap token too: the connection's
// reply inboxes are that token's login's (bus.EnrollingInboxPrefix) from
// its first login on, since login swaps secrets on one connection and an
// enrolling login may read no other inbox of the node's.
func LoginSecret(cfg Config) string {
	if tok, _, ok := loadSession(cfg); ok {
		return tok
	}
	return cfg.EnrollmentToken
}
