package agent

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// serveSessions runs the configured SessionHost until ctx ends.
func (a *Agent) serveSessions(ctx context.Context) {
	h := a.cfg.Sessions
	if h == nil {
		return
	}
	env := noderuntime.SessionHostEnv{NodeID: a.cfg.NodeID, Conn: a.conn, Runtime: a.rt, Log: a.log,
		FencingToken: func() uint64 { return a.Enrollment().FencingToken }}
	if err := h.Serve(ctx, env); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("session host stopped", zap.Error(err))
	}
}
