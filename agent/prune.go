package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// The agent's side of disk collection (agent/disk) that talks to the
// control plane: what booked Runs need kept, and the operator's prune.

// askKeep asks the control plane what Runs booked or queued here need.
func (a *Agent) askKeep(ctx context.Context) (schemas.DiskKeep, error) {
	req := schemas.DiskKeepRequest{NodeID: a.cfg.NodeID, FencingToken: a.Enrollment().FencingToken}
	var rep schemas.Reply[schemas.DiskKeep]
	if err := a.req.Request(ctx, requestTimeout, bus.NodeDiskKeep(a.cfg.NodeID), req, &rep); err != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", err)
	}
	if rep.Refusal != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", rep.Refusal)
	}
	if rep.OK == nil {
		return schemas.DiskKeep{}, errors.New("agent: ask what to keep: empty reply")
	}
	if err := rep.OK.Validate(); err != nil {
		return schemas.DiskKeep{}, fmt.Errorf("agent: ask what to keep: %w", err)
	}
	return *rep.OK, nil
}

// servePrune answers the control plane's prune requests on
// wf.node.<id>.disk.prune until stop is called; stop returns once no
// prune is in hand (cancel ctx first to cut one short).
func (a *Agent) servePrune(ctx context.Context) (stop func(), err error) {
	var (
		mu       sync.Mutex
		stopped  bool
		inflight sync.WaitGroup
	)
	sub, err := a.conn.NC.Subscribe(bus.NodeDiskPrune(a.cfg.NodeID), func(m *nats.Msg) {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		inflight.Add(1)
		mu.Unlock()
		defer inflight.Done()
		a.handlePrune(ctx, m)
	})
	if err != nil {
		return nil, fmt.Errorf("agent: subscribe %s: %w", bus.NodeDiskPrune(a.cfg.NodeID), err)
	}
	return func() {
		_ = sub.Unsubscribe()
		mu.Lock()
		stopped = true
		mu.Unlock()
		inflight.Wait()
	}, nil
}

func (a *Agent) handlePrune(ctx context.Context, m *nats.Msg) {
	var req schemas.DiskPrune
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	enr := a.Enrollment()
	var ref *schemas.Refusal
	switch {
	case err != nil:
		ref = schemas.RefusalOfInput(err, "body is not a DiskPrune")
	case req.NodeID != a.cfg.NodeID:
		ref = &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "prune addressed to node " + req.NodeID}
	case req.FencingToken != enr.FencingToken:
		ref = &schemas.Refusal{Code: schemas.CodeStaleFencingToken, Field: "fencing_token",
			Reason: fmt.Sprintf("prune stamped with fencing token %d; this session holds %d", req.FencingToken, enr.FencingToken)}
	}
	if ref != nil {
		if err := bus.Respond(m, enc, schemas.Reply[schemas.PruneReport]{Refusal: ref}); err != nil {
			a.log.Warn("prune refusal not sent", zap.Error(err))
		}
		return
	}
	a.log.Info("prune requested", zap.Bool("dry_run", req.DryRun), zap.Int("kept_by_control_plane", len(req.Keep.Items)))
	rep := a.disk.Sweep(ctx, req.Keep, true, req.DryRun)
	if err := bus.Respond(m, enc, schemas.Reply[schemas.PruneReport]{OK: &rep}); err != nil {
		a.log.Warn("prune report not sent", zap.Error(err))
	}
}
