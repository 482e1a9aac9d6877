package fake

import (
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// ErrResponseLost is what a call answers when the fake applied it and then
// "lost" the response. It carries no capacity code on purpose: the caller
// cannot know whether anything happened and must reconcile.
var ErrResponseLost = errors.New("fake: response lost after the provider acted")

// chance draws once from the seed; p <= 0 never draws, so a world without
// a fault consumes no randomness for it.
func (p *Provider) chance(prob float64) bool {
	if prob <= 0 {
		return false
	}
	return p.rng.Float64() < prob
}

// jitter scales d by a factor in [1-Jitter, 1+Jitter].
func (p *Provider) jitter(d time.Duration) time.Duration {
	j := p.cfg.Latency.Jitter
	if d <= 0 || j <= 0 {
		return d
	}
	f := 1 + j*(2*p.rng.Float64()-1)
	return time.Duration(float64(d) * f)
}

// enter runs what every call goes through: virtual call latency, refused
// credentials, rate limiting. It returns now after the call's latency.
func (p *Provider) enter(op string) (time.Time, error) {
	if a, ok := p.clock.(Advancer); ok {
		a.Advance(p.jitter(p.cfg.Latency.Call))
	}
	now := p.clock.Now()
	if p.cfg.RejectCredentials {
		return now, p.fail(capacity.CodeUnauthorized, op, "", "credentials refused")
	}
	if p.chance(p.cfg.Faults.RateLimit) {
		retry := p.cfg.Faults.RetryAfter
		if retry <= 0 {
			retry = 2 * time.Second
		}
		err := p.fail(capacity.CodeRateLimited, op, "", "slow down")
		err.RetryAfter = retry
		return now, err
	}
	return now, nil
}

// fail builds a coded error and traces it; callers hold p.mu.
func (p *Provider) fail(code capacity.Code, op, ref, msg string) *capacity.Error {
	p.tracef("%s %s -> %s", op, ref, code)
	return refuse(code, op, ref, msg)
}

// refuse builds a coded error without touching the world (no lock needed).
func refuse(code capacity.Code, op, ref, msg string) *capacity.Error {
	return &capacity.Error{Code: code, Provider: Type, Op: op, Ref: ref, Message: msg}
}
