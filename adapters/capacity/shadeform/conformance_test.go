package shadeform_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/conformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/shadeform"
	"github.com/warmfleet/warmfleet/adapters/capacity/shadeform/shadeformtest"
)

const testKey = "sk-test-5f1c0ffee5ecret"

// world is a provider and the fake API behind it. It is a
// capacity.Provider itself, so the conformance hooks can reach the server.
type world struct {
	*shadeform.Provider
	srv *shadeformtest.Server
	dir string
}

func newWorld(t *testing.T, mutate ...func(*shadeform.Config)) *world {
	t.Helper()
	srv := shadeformtest.New(t, testKey)
	cfg := shadeform.Config{
		ConnectionID: "conn-test", BaseURL: srv.BaseURL, APIKey: shadeform.NewAPIKey(testKey),
		HTTPClient: &http.Client{Timeout: 10 * time.Second}, Now: srv.Now,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	p, err := shadeform.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &world{Provider: p, srv: srv, dir: t.TempDir()}
}

// allocationsFor counts the instances ever created for a rental, deleted
// ones included, on the server's side.
func (w *world) allocationsFor(rental string) int {
	n := 0
	for _, in := range w.srv.Instances() {
		for _, tag := range in.Tags {
			if tag == "wf-rental="+rental {
				n++
				break
			}
		}
	}
	return n
}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) capacity.Provider { return newWorld(t) }, conformance.Options{
		OutOfStockOfferID: "datacrunch/FIN-01/B200x8",
		Advance:           func(p capacity.Provider, d time.Duration) { p.(*world).srv.Advance(d) },
		Received: func(t *testing.T, p capacity.Provider, ref string) ([]byte, bool) {
			w := p.(*world)
			got, err := w.srv.Received(ref, w.dir)
			if err != nil {
				t.Errorf("booting %s: %v", ref, err)
				return nil, false
			}
			return got, true
		},
		Allocations: func(_ *testing.T, p capacity.Provider, rental string) int { return p.(*world).allocationsFor(rental) },
		PlantForeign: func(_ *testing.T, p capacity.Provider, rental, token string) string {
			// Same name as ours, same rental tag, another owner.
			return p.(*world).srv.AddInstance("wf-"+rental+"-g1", "wf-owner="+token, "wf-rental="+rental, "wf-generation=1")
		},
	})
}
