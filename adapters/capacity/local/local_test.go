package local_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/conformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/schemas"
)

// process stands in for an agent process: the conformance suite checks the
// provider's contract, not the agent (e2e does that with real agents).
type process struct {
	once sync.Once
	done chan struct{}
}

func (p *process) Stop(context.Context) error { p.once.Do(func() { close(p.done) }); return nil }
func (p *process) Done() <-chan struct{}      { return p.done }

func newProvider(t *testing.T) capacity.Provider {
	return local.New(func(context.Context, string, schemas.NodeBootstrap) (local.Machine, error) {
		return &process{done: make(chan struct{})}, nil
	}, capacity.Offer{ID: "local", CPUMillis: 2000, MemoryBytes: 1 << 30, PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 100_000, Exact: true}})
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newProvider, conformance.Options{
		Received: func(t *testing.T, p capacity.Provider, ref string) ([]byte, bool) {
			b, ok := p.(*local.Provider).Bootstrap(ref)
			if !ok {
				return nil, false
			}
			data, err := json.Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			return data, true
		},
	})
}
