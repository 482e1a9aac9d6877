package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// placements are the nodes operators' attaches placed sessions on, in
// wf_leases (bus.SessionPlacementKey), shared by every replica: an agent's
// lease acquire may reach another replica than the one whose attach asked
// it. A node acquires a session's lease only while an attach placed the
// session on it.
type placements struct {
	kv  jetstream.KeyValue // wf_leases
	now func() time.Time
}

// place records that key is being attached to node until until (the
// attach's deadline), replacing any earlier placement of the session.
func (p placements) place(ctx context.Context, key residency.Key, node string, until time.Time) error {
	b, err := json.Marshal(schemas.SessionPlacement{Tenant: key.Tenant, Session: key.Session, Node: node, ExpiresAt: until})
	if err != nil {
		return err
	}
	if _, err := p.kv.Put(ctx, bus.SessionPlacementKey(key.Tenant, key.Session), b); err != nil {
		return fmt.Errorf("sessions: place %s on %s: %w", key, node, err)
	}
	return nil
}

// check refuses (residency.ErrNotPlaced) node's acquire of key's lease
// unless an attach placed the session on node and has not run out.
func (p placements) check(ctx context.Context, key residency.Key, node string) error {
	var pl schemas.SessionPlacement
	_, err := bus.GetJSON(ctx, p.kv, bus.SessionPlacementKey(key.Tenant, key.Session), &pl)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: no attach placed %s on node %s; an operator's attach acquires a lease", residency.ErrNotPlaced, key, node)
	case err != nil:
		return fmt.Errorf("sessions: read placement of %s: %w", key, err)
	case pl.Node != node:
		return fmt.Errorf("%w: %s is placed on another node, not %s", residency.ErrNotPlaced, key, node)
	case !p.now().Before(pl.ExpiresAt):
		return fmt.Errorf("%w: the attach that placed %s on node %s ran out at %s", residency.ErrNotPlaced, key, node, pl.ExpiresAt.Format(time.RFC3339))
	}
	return nil
}
