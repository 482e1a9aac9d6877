// Package runpodserverless runs Runs on RunPod serverless queue endpoints
// (https://api.runpod.ai/v2/<endpoint>: run, status, cancel, purge-queue,
// health) as the ephemeral lane: each configured endpoint is a standing
// pool of workers serving one image, so an execution is released, never
// terminated, and nothing is reused between Runs.
//
// RunPod documents no idempotency key for /run and no way to list an
// endpoint's jobs, so this executor declares neither: a launch carries its
// launch key in its input (for the worker's own deduplication) and a ttl
// policy, so a launch whose answer was lost is reclaimed by RunPod rather
// than billed for ever; the caller treats such an attempt as lost.
package runpodserverless

import (
	"context"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/apicall"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// Type is the adapter type string.
const Type = "runpod-serverless"

// DefaultBaseURL is RunPod's serverless API root; EnvAPIKey is read when
// the Config names neither a key nor a file.
const (
	DefaultBaseURL = "https://api.runpod.ai/v2"
	EnvAPIKey      = "RUNPOD_API_KEY"
)

// Endpoint is one queue endpoint the executor may run on: the image its
// workers run, their cards and the per-second rate RunPod bills.
type Endpoint struct {
	ID    string `json:"id"`
	Image string `json:"image"`
	// GPUModel and GPUCount are each worker's cards; CPUMillis and
	// MemoryBytes its size.
	GPUModel    string `json:"gpu_model,omitempty"`
	GPUCount    int64  `json:"gpu_count,omitempty"`
	CPUMillis   int64  `json:"cpu_millis,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	// USDPerSecond is the worker's rate.
	USDPerSecond float64 `json:"usd_per_second"`
	// ColdStartSeconds is assumed for the start when no worker is idle
	// (default 30); MaxRuntimeSeconds the endpoint's execution timeout.
	ColdStartSeconds  int64 `json:"cold_start_seconds,omitempty"`
	MaxRuntimeSeconds int64 `json:"max_runtime_seconds,omitempty"`
}

// Config configures an Executor.
type Config struct {
	ConnectionID string
	BaseURL      string
	APIKey       apicall.Key
	APIKeyFile   string
	Getenv       func(string) string
	HTTPClient   *http.Client
	Logger       *zap.Logger
	Now          func() time.Time
	Endpoints    []Endpoint
}

// Executor implements ephemeral.Executor against RunPod serverless.
type Executor struct {
	api       *apicall.Client
	endpoints []Endpoint
	log       *zap.Logger
	now       func() time.Time
}

var (
	_ ephemeral.Executor = (*Executor)(nil)
	_ capacity.Declarer  = (*Executor)(nil)
)

// New returns an Executor. It makes no request; Verify does.
func New(cfg Config) (*Executor, error) {
	key, err := apicall.KeySource{Provider: Type, Key: cfg.APIKey, File: cfg.APIKeyFile, Env: EnvAPIKey, Getenv: cfg.Getenv}.Load()
	if err != nil {
		return nil, err
	}
	if len(cfg.Endpoints) == 0 {
		return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: "configure", Message: "no endpoint: name at least one queue endpoint and the image it runs"}
	}
	for _, e := range cfg.Endpoints {
		if e.ID == "" || e.Image == "" || !(e.USDPerSecond >= 0) {
			return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: "configure", Message: "an endpoint needs an id, an image (name@sha256:…) and a rate"}
		}
	}
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	api, err := apicall.NewClient(Type, base, key, apicall.Bearer, cfg.HTTPClient, cfg.Logger, cfg.Now)
	if err != nil {
		return nil, err
	}
	return &Executor{api: api, endpoints: slices.Clone(cfg.Endpoints), log: api.Log, now: api.Now}, nil
}

// support is what RunPod serverless offers through this executor.
var support = capacity.EphemeralSupport{
	ReusableBetweenRuns: false,
	// Workers' caches are not observable.
	ObservableLocality: false,
	// /cancel ends a job still IN_QUEUE.
	CancelQueued: true,
	// policy.ttl: RunPod drops the job once it passes.
	ProviderTTL: true,
	// No idempotency key and no job listing.
	IdempotentLaunch: capacity.IdempotencyNone,
	ListOwned:        false,
	// Workers bill per second at the endpoint's stated rate.
	ExactPricing: true,
	StandingPool: true,
}

// Support reports what the executor can do.
func (e *Executor) Support() capacity.EphemeralSupport { return support }

// Declaration states the lane.
func (e *Executor) Declaration() capacity.Declaration {
	s := support
	return capacity.Declaration{Type: Type, Lane: capacity.LaneEphemeral, Ephemeral: &s}
}

// Verify reads the first endpoint's health.
func (e *Executor) Verify(ctx context.Context) error {
	_, err := e.health(ctx, "verify", e.endpoints[0].ID)
	return err
}

// endpoint is the configured endpoint id names.
func (e *Executor) endpoint(id string) (Endpoint, bool) {
	i := slices.IndexFunc(e.endpoints, func(ep Endpoint) bool { return ep.ID == id })
	if i < 0 {
		return Endpoint{}, false
	}
	return e.endpoints[i], true
}
