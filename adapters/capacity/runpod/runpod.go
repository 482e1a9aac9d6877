// Package runpod rents GPU pods through RunPod's public API: its REST API
// (https://rest.runpod.io/v1, /pods) to create, observe, stop, start,
// list and delete pods, and its GraphQL gpuTypes query for the catalogue
// and prices. A pod runs the operator's agent image; the node bootstrap
// reaches it in the pod's environment.
//
// RunPod takes no idempotency key, so provisions are made safe by listing:
// every pod carries, in its environment, the deployment's ownership token,
// its connection, rental, generation and operation key, and a provision
// first looks for a pod already carrying its operation key. Only pods
// carrying our ownership token are acted on. A pod stopped keeps its volume
// (stop and resume are warm); interruptible (spot) pods are rented from a
// gpu type's spot price, and one that stops without our asking was taken
// back.
package runpod

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/apicall"
	"github.com/warmfleet/warmfleet/internal/keyed"
)

// Type is the adapter type string.
const Type = "runpod"

// Defaults for Config.
const (
	DefaultBaseURL    = "https://rest.runpod.io/v1"
	DefaultGraphQLURL = "https://api.runpod.io/graphql"
	// EnvAPIKey is read when the Config names neither a key nor a file.
	EnvAPIKey = "RUNPOD_API_KEY"
)

// Config configures a Provider.
type Config struct {
	ConnectionID string
	// BaseURL is the REST root, GraphQLURL the GraphQL endpoint.
	BaseURL, GraphQLURL string
	// APIKey is the key; when zero APIKeyFile is read, else RUNPOD_API_KEY.
	APIKey     apicall.Key
	APIKeyFile string
	Getenv     func(string) string
	HTTPClient *http.Client
	Logger     *zap.Logger
	Now        func() time.Time
	// Image is the pod image: one whose entrypoint runs warmfleet-agent
	// with the bootstrap in WARMFLEET_BOOTSTRAP (base64 of its JSON).
	Image string
	// CloudType is SECURE, COMMUNITY or ALL (default SECURE): which of a
	// gpu type's prices an offer quotes.
	CloudType string
	// GPUCounts are the pod sizes offered per gpu type (default 1).
	GPUCounts []int
	// VCPUPerGPU and MemoryGiBPerGPU size an offer's CPU and memory
	// (RunPod's minimums per card; defaults 8 and 32).
	VCPUPerGPU, MemoryGiBPerGPU int
	// ContainerDiskGB and VolumeGB size a pod's disks (defaults 50, 100);
	// the volume, at /workspace, survives a stop.
	ContainerDiskGB, VolumeGB int
}

// Provider implements capacity.Provider against RunPod.
type Provider struct {
	cfg     Config
	rest    *apicall.Client
	graphql *apicall.Client
	log     *zap.Logger
	now     func() time.Time
	// keys holds an OperationKey across list-then-create (RunPod takes no
	// idempotency key).
	keys keyed.Mutex

	mu sync.Mutex
	// gpuTypes maps an offer id to the gpu type it rents, as last listed.
	gpuTypes map[string]string
	// stopped are the pods this process asked to stop: an interruptible
	// pod found stopped that is not here was taken back.
	stopped map[string]bool
}

var (
	_ capacity.Provider = (*Provider)(nil)
	_ capacity.Declarer = (*Provider)(nil)
)

// New returns a Provider. It makes no request; Verify does.
func New(cfg Config) (*Provider, error) {
	key, err := apicall.KeySource{Provider: Type, Key: cfg.APIKey, File: cfg.APIKeyFile, Env: EnvAPIKey, Getenv: cfg.Getenv}.Load()
	if err != nil {
		return nil, err
	}
	if cfg.Image == "" {
		return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: "configure", Message: "an agent image is required (the pods run it)"}
	}
	cfg.defaults()
	rest, err := apicall.NewClient(Type, cfg.BaseURL, key, apicall.Bearer, cfg.HTTPClient, cfg.Logger, cfg.Now)
	if err != nil {
		return nil, err
	}
	gql, err := apicall.NewClient(Type, cfg.GraphQLURL, key, apicall.Bearer, cfg.HTTPClient, cfg.Logger, cfg.Now)
	if err != nil {
		return nil, err
	}
	rest.Stock = append([]string{"no longer any instances available", "no instances available"}, apicall.StockPhrases...)
	return &Provider{cfg: cfg, rest: rest, graphql: gql, log: rest.Log, now: rest.Now, gpuTypes: map[string]string{}, stopped: map[string]bool{}}, nil
}

func (c *Config) defaults() {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.GraphQLURL == "" {
		c.GraphQLURL = DefaultGraphQLURL
	}
	if c.CloudType == "" {
		c.CloudType = "SECURE"
	}
	if len(c.GPUCounts) == 0 {
		c.GPUCounts = []int{1}
	}
	if c.VCPUPerGPU <= 0 {
		c.VCPUPerGPU = 8
	}
	if c.MemoryGiBPerGPU <= 0 {
		c.MemoryGiBPerGPU = 32
	}
	if c.ContainerDiskGB <= 0 {
		c.ContainerDiskGB = 50
	}
	if c.VolumeGB <= 0 {
		c.VolumeGB = 100
	}
}

// support is what RunPod pods offer through this adapter.
var support = capacity.Support{
	// A stopped pod keeps its volume and comes back under its id.
	Stop: true, Resume: true, PersistentDisk: true,
	// Interruptible pods are rented at a gpu type's spot price.
	Spot: true,
	// costPerHr is what RunPod bills.
	ExactPricing:        true,
	IdempotentProvision: capacity.IdempotencyNone,
	ListOwned:           true,
	// A deleted pod is gone from /pods.
	ObserveAfterTerminate: false,
	// Pods carry their generation but RunPod cannot refuse a stale stop or
	// start: the control plane's CAS fences its own commands.
	GenerationFencing: false,
	// No provider-side lifetime.
	MaxLifetime: false,
}

// Support reports what RunPod can do through this adapter.
func (p *Provider) Support() capacity.Support { return support }

// Declaration states the adapter type and its capacity support.
func (p *Provider) Declaration() capacity.Declaration {
	s := support
	return capacity.Declaration{Type: Type, Lane: capacity.LaneNodes, Capacity: &s}
}

// Verify lists pods: a cheap check of the key and the API.
func (p *Provider) Verify(ctx context.Context) error {
	_, err := p.rest.Call(ctx, "verify", "", http.MethodGet, "/pods", nil)
	return err
}
