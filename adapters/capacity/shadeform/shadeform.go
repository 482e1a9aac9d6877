// Package shadeform rents GPU machines through Shadeform's marketplace API
// (https://docs.shadeform.ai): it lists instance types as offers, creates
// instances with a startup script that installs the node bootstrap, and
// observes, lists and deletes them.
//
// Shadeform has no stop/resume and no idempotency key, so this adapter
// declares neither and makes provisions safe itself: it names and tags every
// instance with its rental, generation, operation key and the deployment's
// ownership token, and before creating it looks for an instance already
// carrying the operation key. It acts only on instances carrying our
// ownership token.
package shadeform

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/apicall"
	"github.com/warmfleet/warmfleet/internal/keyed"
)

// Type is the adapter type string.
const Type = "shadeform"

// DefaultBaseURL is Shadeform's production API.
const DefaultBaseURL = "https://api.shadeform.ai/v1"

// Config configures a Provider.
type Config struct {
	// ConnectionID names this connection in owned-capacity listings and
	// instance tags.
	ConnectionID string
	// BaseURL is the API root; DefaultBaseURL when empty.
	BaseURL string
	// APIKey is the key. When zero, APIKeyFile is read; when that is empty
	// too, the SHADEFORM_API_KEY environment variable.
	APIKey     APIKey
	APIKeyFile string
	// Getenv reads the environment; os.Getenv when nil.
	Getenv func(string) string
	// HTTPClient sends requests; a client with a 60s timeout when nil. The
	// adapter uses a copy that refuses cross-host redirects.
	HTTPClient *http.Client
	// Logger gets debug lines per request (method, path, status, duration;
	// never headers or bodies); zap.NewNop when nil.
	Logger *zap.Logger
	// Now is the adapter's clock for receipts and observations; time.Now
	// when nil.
	Now func() time.Time
	// OS and SSHKeyID are passed to instance creation when set.
	OS       string
	SSHKeyID string
}

// Provider implements capacity.Provider against Shadeform's API.
type Provider struct {
	connID string
	api    *apicall.Client
	log    *zap.Logger
	now    func() time.Time
	os     string
	sshKey string
	// keys holds an OperationKey across list-then-create: Shadeform has
	// no idempotency key, so two provisions racing with one key in this
	// process would both see "not created yet" and both create. (Across
	// processes the control plane's CAS on the rental keeps one caller per
	// key.)
	keys keyed.Mutex
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
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	api, err := apicall.NewClient(Type, base, key, func(r *http.Request, k string) { r.Header.Set("X-API-KEY", k) }, cfg.HTTPClient, cfg.Logger, cfg.Now)
	if err != nil {
		return nil, err
	}
	return &Provider{connID: cfg.ConnectionID, api: api, log: api.Log, now: api.Now, os: cfg.OS, sshKey: cfg.SSHKeyID}, nil
}

// support is what Shadeform offers through this adapter.
var support = capacity.Support{
	// No stop or resume: an instance is created or deleted.
	Stop: false, Resume: false, PersistentDisk: false,
	// Spot availability is listed for some clouds, but creating spot
	// capacity is not documented, so this adapter rents on-demand only.
	Spot: false,
	// hourly_price excludes Shadeform's platform fee: an estimate.
	ExactPricing:        false,
	IdempotentProvision: capacity.IdempotencyNone,
	ListOwned:           true,
	// /info documents a "deleted" status and a deleted_at date, so a deleted
	// instance is taken to stay observable (how long is undocumented).
	ObserveAfterTerminate: true,
	// Each generation is a new instance whose generation tag never changes,
	// so the adapter's own check of that tag is race-free.
	GenerationFencing: true,
	// auto_delete.date_threshold reclaims the instance on Shadeform's side.
	MaxLifetime: true,
}

// Support reports what Shadeform can do through this adapter.
func (p *Provider) Support() capacity.Support { return support }

// Declaration states the adapter type and its capacity support.
func (p *Provider) Declaration() capacity.Declaration {
	s := support
	return capacity.Declaration{Type: Type, Lane: capacity.LaneNodes, Capacity: &s}
}

// Verify lists instances: it checks the key and reachability and allocates
// nothing.
func (p *Provider) Verify(ctx context.Context) error {
	_, err := p.api.Call(ctx, "verify", "", http.MethodGet, "/instances", nil)
	return err
}

// ListCapacity lists instance types as one offer per (cloud, region, type).
func (p *Provider) ListCapacity(ctx context.Context, q capacity.OfferQuery) ([]capacity.Offer, error) {
	path := "/instances/types"
	if q.AvailableOnly {
		path += "?available=true"
	}
	body, err := p.api.Call(ctx, "list_capacity", "", http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	types, err := decodeInstanceTypes(body)
	if err != nil {
		return nil, p.api.DecodeError("list_capacity", "", err)
	}
	var out []capacity.Offer
	for _, o := range offersOf(types) {
		if q.Matches(o) {
			out = append(out, o)
		}
	}
	return out, nil
}

// StartCapacity is unsupported: Shadeform cannot resume an instance.
func (p *Provider) StartCapacity(context.Context, capacity.Command) (capacity.Receipt, error) {
	return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeUnsupported, Provider: Type, Op: "start", Message: "Shadeform instances cannot be stopped or resumed"}
}

// StopCapacity is unsupported: Shadeform cannot stop an instance.
func (p *Provider) StopCapacity(context.Context, capacity.Command) (capacity.Receipt, error) {
	return capacity.Receipt{}, &capacity.Error{Code: capacity.CodeUnsupported, Provider: Type, Op: "stop", Message: "Shadeform instances cannot be stopped or resumed"}
}

// stampErr wraps a validation error with this adapter's context.
func stampErr(err error, op, ref string) error {
	if e, ok := err.(*capacity.Error); ok {
		e.Provider, e.Op, e.Ref = Type, op, ref
	}
	return err
}
