package local

import (
	"context"
	"fmt"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// WithSpotOffer adds an interruptible offer beside the on-demand one: the
// same machine at o's price, which Interrupt may take back at any moment
// as a provider reclaiming spot capacity does. It declares Spot.
func WithSpotOffer(o capacity.Offer) Option {
	return func(p *Provider) {
		if o.ID == "" {
			o.ID = "local-spot"
		}
		o.Provider, o.Available, o.Interruptible = "local", true, true
		p.spot = &o
	}
}

// offers is what the provider lists.
func (p *Provider) offers() []capacity.Offer {
	if p.spot == nil {
		return []capacity.Offer{p.offer}
	}
	return []capacity.Offer{p.offer, *p.spot}
}

// offerFor is the offer a provision rents: the spot one when it names it
// (or asks for interruptible capacity and there is one), else the
// on-demand one.
func (p *Provider) offerFor(cmd capacity.ProvisionCommand) capacity.Offer {
	if p.spot != nil && (cmd.OfferID == p.spot.ID || cmd.Interruptible && cmd.OfferID != p.offer.ID) {
		return *p.spot
	}
	return p.offer
}

// Interrupt takes an interruptible machine back, as a provider reclaiming
// spot capacity does: its agent stops at once, and the machine is reported
// terminated and interrupted from then on. An on-demand machine is not
// interrupted.
func (p *Provider) Interrupt(ctx context.Context, nativeRef string) error {
	p.mu.Lock()
	m, ok := p.machines[nativeRef]
	p.mu.Unlock()
	if !ok {
		return capacity.Errorf(capacity.CodeNotFound, "no local machine %s", nativeRef)
	}
	m.op.Lock()
	defer m.op.Unlock()
	p.mu.Lock()
	if !m.offer.Interruptible {
		p.mu.Unlock()
		return fmt.Errorf("local: machine %s is on-demand: %w", nativeRef, capacity.ErrUnsupported)
	}
	if m.state == capacity.StateTerminated {
		p.mu.Unlock()
		return nil
	}
	mach := m.m
	p.mu.Unlock()
	var err error
	if mach != nil {
		err = mach.Stop(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m.state, m.since, m.interrupted = capacity.StateTerminated, p.now(), true
	return err
}
