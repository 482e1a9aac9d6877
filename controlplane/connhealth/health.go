// Package connhealth owns a provider connection's health as one control
// plane replica last verified it: unverified, ok, or failed with the
// provider's error. A connection that is not ok is skipped by whatever
// rents or launches through it, and shown so to operators.
package connhealth

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// verifyTimeout bounds one Verify call.
const verifyTimeout = 30 * time.Second

// Health is one connection's last check.
type Health struct {
	id, typ string

	mu         sync.Mutex
	state      string
	err        string
	verifiedAt time.Time
}

// New is connection id's health before its first check.
func New(id, typ string) *Health {
	return &Health{id: id, typ: typ, state: schemas.ConnectionPending}
}

// State is the connection's state as last verified.
func (h *Health) State() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// Usable reports whether the connection's last check succeeded.
func (h *Health) Usable() bool { return h.State() == schemas.ConnectionOK }

// Verify runs check (the provider's Verify) and records the outcome,
// logging only a change.
func (h *Health) Verify(ctx context.Context, check func(context.Context) error, now time.Time, log *zap.Logger) {
	vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	err := check(vctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.state
	h.verifiedAt = now
	if err != nil {
		h.state, h.err = schemas.ConnectionFailed, err.Error()
		if was != schemas.ConnectionFailed {
			log.Warn("provider connection failed its check; skipped until it passes", zap.String("connection_id", h.id), zap.String("type", h.typ), zap.Error(err))
		}
		return
	}
	h.state, h.err = schemas.ConnectionOK, ""
	if was != schemas.ConnectionOK {
		log.Info("provider connection verified", zap.String("connection_id", h.id), zap.String("type", h.typ))
	}
}

// Status is the connection as operators see it; its owner fills in what
// it holds there (live rentals or executions, limits).
func (h *Health) Status() schemas.ConnectionStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return schemas.ConnectionStatus{ID: h.id, Type: h.typ, State: h.state, Error: h.err, VerifiedAt: h.verifiedAt}
}

// Every and NotVerified select connections to check: every one at start,
// and afterwards those whose last check failed or has yet to run.
func Every(string) bool             { return true }
func NotVerified(state string) bool { return state != schemas.ConnectionOK }

// Pending selects the connections never checked.
func Pending(state string) bool { return state == schemas.ConnectionPending }
