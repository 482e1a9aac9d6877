// Package registryauth is the control plane's registry credentials: the
// sources an operator gives `warmfleet serve` (a Docker config.json, and
// Docker credential helpers per registry), and the service that hands a
// credential to a node's current session, at pull time, for an image that
// node has a live booking or prefetch for (wf.node.<id>.credentials.registry,
// core request/reply). A credential is held in memory only: never written
// to a stream, KV, event or log.
package registryauth

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/warmfleet/warmfleet/schemas"
)

// Tenant names whose credentials a lookup wants: the booked Run's tenant,
// or the prefetch's. A tenant's own credentials are consulted first, then
// the fleet's.
type Tenant string

// NoTenant is the fleet's own credentials only.
const NoTenant Tenant = ""

// Source holds the credentials the control plane can give, by registry.
// For a registry it tries, in order: a helper named by flag, the file's
// credHelpers, the file's auths, the file's credsStore; with none of them
// (or a helper that holds nothing for it) the answer is anonymous. A
// tenant's own file (AddTenant) is tried the same way before all of that,
// for that tenant's lookups only. A nil Source answers anonymous for every
// registry.
type Source struct {
	helpers map[string]string // registry → helper name: flags over credHelpers
	static  map[string]StaticCredential
	store   string
	runner  HelperRunner
	// tenants are the tenants' own credentials, which hold no tenants.
	tenants map[Tenant]*Source
}

// NewSource combines a parsed file (nil: none) with helpers given by flag
// (registry host → helper name), which win over the file's.
func NewSource(file *DockerConfig, flagHelpers map[string]string, runner HelperRunner) (*Source, error) {
	s := &Source{helpers: map[string]string{}, static: map[string]StaticCredential{}, runner: runner}
	if file != nil {
		maps.Copy(s.helpers, file.CredHelpers)
		maps.Copy(s.static, file.Auths)
		s.store = file.CredsStore
	}
	for host, name := range flagHelpers {
		canon := schemas.CanonicalRegistry(host)
		if !registryHost.MatchString(canon) {
			return nil, fmt.Errorf("registry credential helper: %q is not a registry host[:port]; write HOST=HELPER, e.g. 123.dkr.ecr.us-east-1.amazonaws.com=ecr-login", host)
		}
		if !helperName.MatchString(name) {
			return nil, fmt.Errorf("registry credential helper for %s: %q is not a helper name (the part after docker-credential-); letters, digits, '.', '_', '-'", canon, name)
		}
		s.helpers[canon] = name
	}
	return s, nil
}

// AddTenant gives tenant its own credentials, a parsed Docker config.json
// (as `serve --tenant-registry-auth T=PATH` reads it): they are consulted
// first for that tenant's pulls, and never for another tenant's.
func (s *Source) AddTenant(tenant Tenant, file *DockerConfig) error {
	if err := schemas.ValidateTenant("tenant", string(tenant)); err != nil {
		return err
	}
	if _, ok := s.tenants[tenant]; ok {
		return fmt.Errorf("registry credentials of tenant %s are given twice; give one file per tenant", tenant)
	}
	own, err := NewSource(file, nil, s.runner)
	if err != nil {
		return err
	}
	if s.tenants == nil {
		s.tenants = map[Tenant]*Source{}
	}
	s.tenants[tenant] = own
	return nil
}

// Tenants lists the tenants with credentials of their own.
func (s *Source) Tenants() []string {
	if s == nil {
		return nil
	}
	var out []string
	for t := range s.tenants {
		out = append(out, string(t))
	}
	slices.Sort(out)
	return out
}

// CheckTenants refuses credentials given for a tenant that is not among
// configured (none: DefaultTenant only), which no Run could ever use.
func (s *Source) CheckTenants(configured []string) error {
	if len(configured) == 0 {
		configured = []string{schemas.DefaultTenant}
	}
	for _, t := range s.Tenants() {
		if !slices.Contains(configured, t) {
			return &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "tenant",
				Reason: fmt.Sprintf("registry credentials are given for tenant %q, which is not configured (%v): add it to the producer tokens file, or drop its --tenant-registry-auth", t, configured)}
		}
	}
	return nil
}

// Helpers lists the helper names the source may run, for a check at start.
func (s *Source) Helpers() []string {
	if s == nil {
		return nil
	}
	names := slices.Collect(maps.Values(s.helpers))
	if s.store != "" {
		names = append(names, s.store)
	}
	for _, t := range s.tenants {
		names = append(names, t.Helpers()...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Lookup returns tenant's credential for registry (a canonical host): the
// tenant's own when it holds one, else the fleet's, else anonymous. A
// helper that fails, hangs or answers garbage is an error
// (ErrHelperFailed, ErrHelperTimedOut, ErrHelperOutput) that never quotes
// its output.
func (s *Source) Lookup(ctx context.Context, tenant Tenant, registry string) (schemas.RegistryCredential, error) {
	if s == nil {
		return schemas.RegistryCredential{Registry: registry, Anonymous: true}, nil
	}
	if own, ok := s.tenants[tenant]; ok && tenant != NoTenant {
		c, err := own.lookup(ctx, registry)
		if err != nil || !c.Anonymous {
			return c, err
		}
	}
	return s.lookup(ctx, registry)
}

// lookup is Lookup in this source's own credentials.
func (s *Source) lookup(ctx context.Context, registry string) (schemas.RegistryCredential, error) {
	anon := schemas.RegistryCredential{Registry: registry, Anonymous: true}
	var c StaticCredential
	var err error
	switch name, ok := s.helpers[registry]; {
	case ok:
		c, err = s.runner.Get(ctx, name, registry)
	default:
		if st, ok := s.static[registry]; ok {
			c = st
		} else if s.store != "" {
			c, err = s.runner.Get(ctx, s.store, registry)
		} else {
			return anon, nil
		}
	}
	if errors.Is(err, errNotFound) {
		return anon, nil
	}
	if err != nil {
		return schemas.RegistryCredential{}, err
	}
	if c.Username == "" {
		return schemas.RegistryCredential{Registry: registry, Secret: c.IdentityToken}, nil
	}
	return schemas.RegistryCredential{Registry: registry, Username: c.Username, Secret: c.Password}, nil
}
