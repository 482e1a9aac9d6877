package runpodserverless_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity/apicall"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral/execconformance"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpodserverless"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpodserverless/serverlesstest"
)

const (
	testKey = "rp-test-serverless-0c0ffee"
	image   = "registry.example/worker@sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// world is an executor and the fake API behind it.
type world struct {
	*runpodserverless.Executor
	srv *serverlesstest.Server
}

func newWorld(t *testing.T) *world {
	t.Helper()
	srv := serverlesstest.New(t, testKey, "ep-a100")
	e, err := runpodserverless.New(runpodserverless.Config{ConnectionID: "conn-test", BaseURL: srv.BaseURL, APIKey: apicall.NewKey(testKey),
		HTTPClient: &http.Client{Timeout: 10 * time.Second}, Now: srv.Now,
		Endpoints: []runpodserverless.Endpoint{{ID: "ep-a100", Image: image, GPUModel: "A100", GPUCount: 1, CPUMillis: 8000, MemoryBytes: 32 << 30,
			USDPerSecond: 0.00076, ColdStartSeconds: 20, MaxRuntimeSeconds: 3600}}})
	if err != nil {
		t.Fatal(err)
	}
	return &world{Executor: e, srv: srv}
}

func TestConformance(t *testing.T) {
	execconformance.Run(t, func(t *testing.T) ephemeral.Executor { return newWorld(t) }, execconformance.Options{
		Query:   ephemeral.OfferQuery{Image: image},
		Advance: func(e ephemeral.Executor, d time.Duration) { e.(*world).srv.Advance(d) },
		Hold: func(_ *testing.T, e ephemeral.Executor, on bool) {
			e.(*world).srv.Workers("ep-a100", map[bool]int{true: 0, false: 1}[on])
		},
		LoseNextLaunch: func(_ *testing.T, e ephemeral.Executor) { e.(*world).srv.LoseNextRun(1) },
		Launches:       func(_ *testing.T, e ephemeral.Executor) int { return e.(*world).srv.Jobs() },
		Settle:         2 * time.Hour,
	})
}
