package main

import (
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/schemas"
)

// serveRegistryAuth is `warmfleet serve`'s registry credentials: a Docker
// config.json-format file and credential helpers per registry. They are
// read at start (a malformed file stops serve with its line and column)
// and handed to nodes at pull time, never written anywhere.
type serveRegistryAuth struct {
	file    string
	helpers []string
	timeout time.Duration
	// tenantFiles are --tenant-registry-auth's TENANT=PATH.
	tenantFiles []string
}

func (r *serveRegistryAuth) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&r.file, "registry-auth", "", "Docker config.json-format file of registry credentials (auths, credHelpers, credsStore) given to nodes at pull time, e.g. ~/.docker/config.json (default: pull anonymously)")
	f.StringArrayVar(&r.helpers, "registry-credential-helper", nil, "HOST=NAME: get HOST's credential from docker-credential-NAME on PATH (repeatable; wins over the file), e.g. 123.dkr.ecr.us-east-1.amazonaws.com=ecr-login")
	f.DurationVar(&r.timeout, "registry-helper-timeout", registryauth.DefaultHelperTimeout, "how long one credential helper run may take before it is killed and the pull refused")
	f.StringArrayVar(&r.tenantFiles, "tenant-registry-auth", nil, "TENANT=PATH: a Docker config.json-format file of TENANT's own registry credentials, tried before --registry-auth for that tenant's Runs and prefetches and never for another tenant's (repeatable, one per tenant)")
}

// build returns the credential source, nil when none is configured.
func (r *serveRegistryAuth) build(log *zap.Logger) (*registryauth.Source, error) {
	if r.file == "" && len(r.helpers) == 0 && len(r.tenantFiles) == 0 {
		return nil, nil
	}
	if r.timeout <= 0 {
		return nil, fmt.Errorf("--registry-helper-timeout %s: pass a positive duration such as 10s", r.timeout)
	}
	var file *registryauth.DockerConfig
	if r.file != "" {
		var err error
		if file, err = registryauth.LoadConfig(r.file); err != nil {
			return nil, fmt.Errorf("--registry-auth: %w", err)
		}
	}
	helpers := map[string]string{}
	for _, h := range r.helpers {
		host, name, ok := strings.Cut(h, "=")
		if !ok || host == "" || name == "" {
			return nil, fmt.Errorf("--registry-credential-helper %q: write HOST=NAME, e.g. 123.dkr.ecr.us-east-1.amazonaws.com=ecr-login", h)
		}
		helpers[host] = name
	}
	src, err := registryauth.NewSource(file, helpers, registryauth.HelperRunner{Timeout: r.timeout})
	if err != nil {
		return nil, fmt.Errorf("--registry-credential-helper: %w", err)
	}
	if err := r.addTenants(src); err != nil {
		return nil, err
	}
	// A helper installed later still works; say now that it is missing.
	for _, name := range src.Helpers() {
		if _, err := exec.LookPath(registryauth.HelperBinary(name)); err != nil {
			log.Warn("registry credential helper not on PATH; pulls from its registries will be refused until it is installed",
				zap.String("helper", registryauth.HelperBinary(name)))
		}
	}
	log.Info("registry credentials configured", zap.String("file", r.file), zap.Strings("helpers", src.Helpers()), zap.Strings("tenants", src.Tenants()))
	return src, nil
}

// addTenants reads each --tenant-registry-auth TENANT=PATH into src.
func (r *serveRegistryAuth) addTenants(src *registryauth.Source) error {
	for _, tf := range r.tenantFiles {
		tenant, path, ok := strings.Cut(tf, "=")
		if !ok || path == "" {
			return fmt.Errorf("--tenant-registry-auth %q: write TENANT=PATH, e.g. team-a=/etc/warmfleet/team-a-docker.json", tf)
		}
		if err := schemas.ValidateTenant("tenant", tenant); err != nil {
			return fmt.Errorf("--tenant-registry-auth %q: %w", tf, err)
		}
		file, err := registryauth.LoadConfig(path)
		if err != nil {
			return fmt.Errorf("--tenant-registry-auth %s: %w", tenant, err)
		}
		if err := src.AddTenant(registryauth.Tenant(tenant), file); err != nil {
			return fmt.Errorf("--tenant-registry-auth %s: %w", tenant, err)
		}
	}
	return nil
}

// serveArtifactSourceAuth is `warmfleet serve --artifact-source-auth`: the
// headers nodes are given, per fetch, for URL-sourced artifacts
// (artifactauth.URLSource documents the format). Read at start (a
// malformed file stops serve with its line and column, never a value),
// never written anywhere.
type serveArtifactSourceAuth struct{ file string }

func (a *serveArtifactSourceAuth) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.file, "artifact-source-auth", "", "file of `<url-prefix> <Header-Name>: <value>` lines: headers given to nodes per fetch of an artifact under that URL prefix, e.g. `https://models.example.com/ Authorization: Bearer …` (default: fetch URLs anonymously)")
}

// build returns the source, nil when none is configured.
func (a *serveArtifactSourceAuth) build(log *zap.Logger) (*artifactauth.URLSource, error) {
	if a.file == "" {
		return nil, nil
	}
	src, err := artifactauth.LoadURLSource(a.file)
	if err != nil {
		return nil, fmt.Errorf("--artifact-source-auth: %w", err)
	}
	log.Info("artifact source credentials configured", zap.String("file", a.file), zap.Strings("url_prefixes", src.Prefixes()))
	return src, nil
}

// serveCredentialLimit is `warmfleet serve`'s per-node limit on registry
// and artifact credential requests (nodecreds.Limit): past it a node is
// refused rate_limited and told when to ask again, which its agent does.
type serveCredentialLimit struct{ limit nodecreds.Limit }

func (c *serveCredentialLimit) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Float64Var(&c.limit.PerSecond, "credential-rate", nodecreds.DefaultLimit.PerSecond, "registry and artifact credential requests each node may make per second, per kind, after its burst (each may run a credential helper or write an artifact grant)")
	f.IntVar(&c.limit.Burst, "credential-burst", nodecreds.DefaultLimit.Burst, "credential requests of one kind a node may make at once before --credential-rate applies")
}

// build checks the limit.
func (c *serveCredentialLimit) build() (nodecreds.Limit, error) {
	if err := c.limit.Validate(); err != nil {
		return nodecreds.Limit{}, fmt.Errorf("--credential-rate/--credential-burst: %w", err)
	}
	return c.limit, nil
}
