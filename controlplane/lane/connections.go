package lane

import (
	"context"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/controlplane/connhealth"
	"github.com/warmfleet/warmfleet/schemas"
)

// healthOf is each connection's health, by id, before any check.
func healthOf(cs []Connection) map[string]*connhealth.Health {
	out := make(map[string]*connhealth.Health, len(cs))
	for _, k := range cs {
		out[k.ID] = connhealth.New(k.ID, capacity.TypeOf(k.Executor))
	}
	return out
}

// verify checks the connections whose state which selects.
func (m *Manager) verify(ctx context.Context, which func(state string) bool) {
	for _, k := range m.cfg.Connections {
		if h := m.health[k.ID]; which(h.State()) {
			h.Verify(ctx, k.Executor.Verify, m.now(), m.log)
		}
	}
}

// Connections reports each lane connection as this replica sees it: its
// last check, and how many Runs' executions it holds.
func (m *Manager) Connections() []schemas.ConnectionStatus {
	live := map[string]int{}
	if m.cache != nil {
		for _, r := range m.cache.ActiveRuns() {
			if m.Owns(*r) && r.Execution != nil {
				live[r.Execution.Connection]++
			}
		}
	}
	out := make([]schemas.ConnectionStatus, 0, len(m.cfg.Connections))
	for _, k := range m.cfg.Connections {
		st := m.health[k.ID].Status()
		st.Live, st.Lane = live[k.ID], true
		out = append(out, st)
	}
	return out
}
