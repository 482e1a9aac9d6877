package controlplane

import (
	"context"
	"sync"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// connections answers how every provider connection stands
// (wf.admin.rental.connections): the rental manager's, then the ephemeral
// lane's. It is served only when at least one of them is configured.
func (cp *ControlPlane) connections(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	return requests.Serve(ctx, wg, cp.conn.NC, requests.Coded(bus.SubjectConnections, "body is not an AdminRequest",
		func(*schemas.AdminRequest) error { return nil },
		func(context.Context, string, schemas.AdminRequest) ([]schemas.ConnectionStatus, error) {
			out := []schemas.ConnectionStatus{}
			if cp.rentals != nil {
				out = append(out, cp.rentals.Connections()...)
			}
			if cp.lane != nil {
				out = append(out, cp.lane.Connections()...)
			}
			return out, nil
		}, cp.log))
}
