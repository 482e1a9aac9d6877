package runpod_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/apicall"
	"github.com/warmfleet/warmfleet/adapters/capacity/conformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpod"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpod/runpodtest"
)

const testKey = "rp-test-5f1c0ffee5ecret"

// world is a provider and the fake API behind it; it is a
// capacity.Provider itself so the conformance hooks reach the server.
type world struct {
	*runpod.Provider
	srv *runpodtest.Server
}

func newWorld(t *testing.T) *world {
	t.Helper()
	srv := runpodtest.New(t, testKey)
	p, err := runpod.New(runpod.Config{ConnectionID: "conn-test", BaseURL: srv.BaseURL, GraphQLURL: srv.GraphQLURL, APIKey: apicall.NewKey(testKey),
		HTTPClient: &http.Client{Timeout: 10 * time.Second}, Now: srv.Now, Image: "registry.example/warmfleet-agent:1"})
	if err != nil {
		t.Fatal(err)
	}
	return &world{Provider: p, srv: srv}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) capacity.Provider { return newWorld(t) }, conformance.Options{
		OutOfStockOfferID: "1x.od.NVIDIA_B200",
		Advance:           func(p capacity.Provider, d time.Duration) { p.(*world).srv.Advance(d) },
		Received: func(_ *testing.T, p capacity.Provider, ref string) ([]byte, bool) {
			return p.(*world).srv.Received(ref)
		},
		Allocations: func(_ *testing.T, p capacity.Provider, rental string) int {
			return p.(*world).srv.Created("WARMFLEET_RENTAL", rental)
		},
		PlantForeign: func(_ *testing.T, p capacity.Provider, rental, token string) string {
			return p.(*world).srv.PlantForeign(rental, token)
		},
		Interrupt: func(t *testing.T, p capacity.Provider, ref string) {
			if !p.(*world).srv.Interrupt(ref) {
				t.Fatalf("pod %s is not an interruptible running pod", ref)
			}
		},
	})
}

// TestLostCreateAnswer: the create is applied but its answer is lost; the
// same provision asked again finds the pod by its operation key, and no
// second pod is created.
func TestLostCreateAnswer(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	offers, err := w.ListCapacity(ctx, capacity.OfferQuery{})
	if err != nil || len(offers) == 0 {
		t.Fatalf("offers %v, %v", offers, err)
	}
	cmd := capacity.ProvisionCommand{ConnectionID: "conn-test", OperationKey: "rt-1-g1", RentalID: "rt-1", Generation: 1, OwnershipToken: "wf-own",
		OfferID: offers[0].ID}
	w.srv.LoseNext(1)
	if _, err := w.ProvisionCapacity(ctx, cmd); err == nil || !capacity.Ambiguous(err) {
		t.Fatalf("lost answer: %v; want an ambiguous error", err)
	}
	rc, err := w.ProvisionCapacity(ctx, cmd)
	if err != nil || !rc.Duplicate {
		t.Fatalf("again: %+v, %v; want the pod the lost answer made", rc, err)
	}
	if n := w.srv.Created("WARMFLEET_RENTAL", "rt-1"); n != 1 {
		t.Fatalf("%d pods created", n)
	}
}

// TestObservationHidesEnvironment: a pod's environment (its bootstrap and
// enrollment token) never reaches an observation, and errors never carry
// the key.
func TestObservationHidesEnvironment(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	offers, _ := w.ListCapacity(ctx, capacity.OfferQuery{})
	cmd := capacity.ProvisionCommand{ConnectionID: "conn-test", OperationKey: "rt-2-g1", RentalID: "rt-2", Generation: 1, OwnershipToken: "wf-own",
		OfferID: offers[0].ID}
	cmd.Bootstrap.EnrollmentToken = "enroll-secret-77"
	rc, err := w.ProvisionCapacity(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := w.ObserveCapacity(ctx, cmd.Ref(rc.NativeRef))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(obs)
	if strings.Contains(string(b), "enroll-secret-77") || strings.Contains(string(b), "WARMFLEET_BOOTSTRAP") || !strings.Contains(obs.NativeJSON, rc.NativeRef) {
		t.Fatalf("observation %s", b)
	}
	w.srv.Fail(http.MethodGet, "/v1/pods", http.StatusUnauthorized, `{"error": "bad key `+testKey+`"}`, nil)
	if err := w.Verify(ctx); !errors.Is(err, capacity.ErrUnauthorized) || strings.Contains(err.Error(), testKey) {
		t.Fatalf("verify with a refused key: %v", err)
	}
}
