package shadeform

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// ProvisionCapacity creates an instance for the rental, unless one carrying
// our ownership token and this OperationKey already exists, in which case
// it answers that one as a Duplicate. That listing is the only thing that
// makes a retried provision safe: Shadeform takes no idempotency key.
func (p *Provider) ProvisionCapacity(ctx context.Context, cmd capacity.ProvisionCommand) (capacity.Receipt, error) {
	const op = "provision"
	if err := cmd.Validate(); err != nil {
		return capacity.Receipt{}, stampErr(err, op, cmd.RentalID)
	}
	cloud, region, shadeType, ok := parseOfferID(cmd.OfferID)
	if !ok {
		return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: cmd.RentalID,
			Message: "offer_id is not a shadeform offer (cloud/region/instance_type)"}
	}
	unlock, err := p.keys.LockContext(ctx, cmd.OperationKey)
	if err != nil {
		return capacity.Receipt{}, fmt.Errorf("shadeform %s %s: %w", op, cmd.RentalID, err)
	}
	defer unlock()

	instances, err := p.listInstances(ctx, op, cmd.RentalID)
	if err != nil {
		return capacity.Receipt{}, err
	}
	for _, in := range instances {
		m := marksOf(in.Tags)
		if !m.ownedBy(cmd.OwnershipToken) {
			continue
		}
		if m.operation == cmd.OperationKey {
			return p.receipt(in, true), nil
		}
		if m.rental == cmd.RentalID && m.generation > cmd.Generation {
			return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeStaleGeneration, Provider: Type, Op: op, Ref: cmd.RentalID,
				Message: fmt.Sprintf("instance %s holds generation %d; this provision is generation %d", in.ID, m.generation, cmd.Generation)}
		}
	}

	script, err := startupScript(cmd.Bootstrap)
	if err != nil {
		return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: cmd.RentalID, Message: "bootstrap does not encode"}
	}
	req := wireCreateRequest{
		Cloud: cloud, Region: region, ShadeInstanceType: shadeType, ShadeCloud: true,
		Name: instanceName(cmd.RentalID, cmd.Generation), OS: p.os, SSHKeyID: p.sshKey,
		LaunchConfiguration: wireLaunchConfiguration{Type: "script",
			ScriptConfiguration: wireScriptConfiguration{Base64Script: base64.StdEncoding.EncodeToString([]byte(script))}},
		Tags: tagsFor(cmd),
	}
	if cmd.MaxLifetimeSeconds > 0 {
		deadline := p.now().Add(time.Duration(cmd.MaxLifetimeSeconds) * time.Second).UTC()
		req.AutoDelete = &wireAutoDelete{DateThreshold: deadline.Format(time.RFC3339)}
	}
	body, err := p.api.Call(ctx, op, cmd.RentalID, http.MethodPost, "/instances/create", req)
	if err != nil {
		// Uncoded errors here (a lost response) leave an instance that the
		// next attempt with this OperationKey finds by its tags.
		return capacity.Receipt{}, err
	}
	created, err := decodeCreate(body)
	if err != nil {
		return capacity.Receipt{}, p.api.DecodeError(op, cmd.RentalID, err)
	}
	p.log.Info("shadeform instance created", zap.String("instance", created.ID), zap.String("rental", cmd.RentalID),
		zap.Uint64("generation", cmd.Generation), zap.String("offer", cmd.OfferID))
	rec := capacity.Receipt{NativeRef: created.ID, State: capacity.StateProvisioning, AcceptedAt: p.now()}
	// The create answer carries no price or status; one look fills them.
	// It is best effort: the instance exists whatever this look says.
	if in, err := p.instanceInfo(ctx, op, created.ID); err == nil {
		rec.State, rec.Pricing = stateOf(in.Status), price(in.HourlyPrice)
	}
	return rec, nil
}

// receipt answers for an instance that already exists.
func (p *Provider) receipt(in wireInstance, dup bool) capacity.Receipt {
	accepted := in.CreatedAt.Time
	if accepted.IsZero() {
		accepted = p.now()
	}
	return capacity.Receipt{NativeRef: in.ID, State: stateOf(in.Status), AcceptedAt: accepted, Duplicate: dup, Pricing: price(in.HourlyPrice)}
}

func (p *Provider) listInstances(ctx context.Context, op, ref string) ([]wireInstance, error) {
	body, err := p.api.Call(ctx, op, ref, http.MethodGet, "/instances", nil)
	if err != nil {
		return nil, err
	}
	instances, err := decodeInstances(body)
	if err != nil {
		return nil, p.api.DecodeError(op, ref, err)
	}
	return instances, nil
}

// instanceInfo reads one instance.
func (p *Provider) instanceInfo(ctx context.Context, op, id string) (wireInstance, error) {
	in, _, err := p.instanceInfoRaw(ctx, op, id)
	return in, err
}

// instanceInfoRaw reads one instance and also returns the raw record, from
// which an observation's NativeJSON is cut.
func (p *Provider) instanceInfoRaw(ctx context.Context, op, id string) (wireInstance, []byte, error) {
	body, err := p.api.Call(ctx, op, id, http.MethodGet, "/instances/"+url.PathEscape(id)+"/info", nil)
	if err != nil {
		return wireInstance{}, nil, err
	}
	in, err := decodeInstance(body)
	if err != nil {
		return wireInstance{}, nil, p.api.DecodeError(op, id, err)
	}
	return in, body, nil
}
