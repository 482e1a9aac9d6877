package shadeform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// ObserveCapacity reads one instance of ours.
func (p *Provider) ObserveCapacity(ctx context.Context, ref capacity.Ref) (capacity.Observation, error) {
	const op = "observe"
	if err := ref.Validate(); err != nil {
		return capacity.Observation{}, stampErr(err, op, ref.NativeRef)
	}
	in, raw, err := p.instanceInfoRaw(ctx, op, ref.NativeRef)
	if err != nil {
		return capacity.Observation{}, err
	}
	if err := p.ours(op, in, ref); err != nil {
		return capacity.Observation{}, err
	}
	obs := capacity.Observation{
		NativeRef: in.ID, State: stateOf(in.Status), ObservedAt: p.now(), StateSince: stateSince(in),
		Endpoint: in.IP, NativeJSON: nativeJSON(raw),
	}
	return obs, nil
}

// ours refuses an instance that lacks our ownership token: it is reported
// not found, and nothing is done to it.
func (p *Provider) ours(op string, in wireInstance, ref capacity.Ref) error {
	if marksOf(in.Tags).ownedBy(ref.OwnershipToken) {
		return nil
	}
	return &capacity.Error{Code: capacity.CodeNotFound, Provider: Type, Op: op, Ref: ref.NativeRef,
		Message: "instance does not carry our ownership token"}
}

// TerminateCapacity deletes an instance of ours. An instance already
// deleting, deleted or gone answers Duplicate; an instance of a newer
// generation refuses with ErrStaleGeneration.
func (p *Provider) TerminateCapacity(ctx context.Context, cmd capacity.Command) (capacity.Receipt, error) {
	const op = "terminate"
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, stampErr(err, op, cmd.NativeRef)
	}
	gone := capacity.Receipt{NativeRef: cmd.NativeRef, State: capacity.StateTerminated, AcceptedAt: p.now(), Duplicate: true}
	in, err := p.instanceInfo(ctx, op, cmd.NativeRef)
	if errors.Is(err, capacity.ErrNotFound) {
		// Gone (or never there): either way nothing of ours runs under this ref.
		return gone, nil
	}
	if err != nil {
		return capacity.Receipt{}, err
	}
	if err := p.ours(op, in, cmd.Ref); err != nil {
		return capacity.Receipt{}, err
	}
	if g := marksOf(in.Tags).generation; g > cmd.Generation {
		return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeStaleGeneration, Provider: Type, Op: op, Ref: cmd.NativeRef,
			Message: fmt.Sprintf("instance is generation %d; this command is generation %d", g, cmd.Generation)}
	}
	switch stateOf(in.Status) {
	case capacity.StateTerminating, capacity.StateTerminated:
		return p.receipt(in, true), nil
	}
	_, err = p.api.Call(ctx, op, cmd.NativeRef, http.MethodPost, "/instances/"+url.PathEscape(cmd.NativeRef)+"/delete", nil)
	if errors.Is(err, capacity.ErrNotFound) {
		return gone, nil
	}
	if err != nil {
		return capacity.Receipt{}, err
	}
	rec := p.receipt(in, false)
	rec.State, rec.AcceptedAt = capacity.StateTerminating, p.now()
	return rec, nil
}

// ListOwnedCapacity lists the existing instances carrying the query's
// ownership token. Shadeform's listing holds pending and active instances,
// so deleted ones never appear.
func (p *Provider) ListOwnedCapacity(ctx context.Context, q capacity.OwnershipQuery) ([]capacity.OwnedCapacity, error) {
	const op = "list_owned"
	if err := q.Validate(); err != nil {
		return nil, stampErr(err, op, "")
	}
	instances, err := p.listInstances(ctx, op, q.RentalID)
	if err != nil {
		return nil, err
	}
	var out []capacity.OwnedCapacity
	for _, in := range instances {
		m := marksOf(in.Tags)
		if !m.ownedBy(q.OwnershipToken) || (q.RentalID != "" && m.rental != q.RentalID) {
			continue
		}
		state := stateOf(in.Status)
		if state == capacity.StateTerminated {
			continue
		}
		out = append(out, capacity.OwnedCapacity{
			NativeRef: in.ID, ConnectionID: p.connID, RentalID: m.rental, Generation: m.generation,
			OwnershipToken: q.OwnershipToken, OperationKey: m.operation, State: state, CreatedAt: in.CreatedAt.Time,
		})
	}
	return out, nil
}
