package containerd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/remotes/docker"
	remoteerrors "github.com/containerd/containerd/remotes/errors"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// plainHTTP says whether a registry host is spoken to over plain HTTP:
// loopback hosts (containerd's own default) and the hosts
// Options.InsecureRegistries names.
func (r *Runtime) plainHTTP(host string) (bool, error) {
	if r.insecure[schemas.CanonicalRegistry(host)] {
		return true, nil
	}
	return docker.MatchLocalhost(host)
}

// pullAuth is one pull's registry authentication: the resolver's
// authorizer asks it for a credential when a registry challenges, and it
// asks the ImageSpec's Credentials callback once per registry host. The
// credential lives in it, in memory, for this pull only.
type pullAuth struct {
	ctx      context.Context
	registry string // the reference's registry, canonical
	ask      func(ctx context.Context, host string) (noderuntime.RegistryCredential, error)

	mu sync.Mutex
	// challenged is set once a registry demanded a credential: a failed
	// pull after that is an authorization failure.
	challenged bool
	answers    map[string]noderuntime.RegistryCredential
	err        error // what the last ask failed with
}

// creds answers the authorizer: the user and secret for host, or none.
// A host other than the reference's registry (a redirect to a blob store
// that challenges) gets nothing: the credential is that registry's only.
func (p *pullAuth) creds(host string) (string, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.challenged = true
	if p.ask == nil || schemas.CanonicalRegistry(host) != p.registry {
		return "", "", nil
	}
	c, ok := p.answers[host]
	if !ok {
		var err error
		if c, err = p.ask(p.ctx, host); err != nil {
			p.err = err
			return "", "", fmt.Errorf("%w: %w", noderuntime.ErrRegistryAuth, err)
		}
		p.answers[host] = c
	}
	if c.Anonymous {
		return "", "", nil
	}
	return c.Username, c.Secret, nil
}

// resolver returns a registry resolver for one pull of ref, authenticating
// through spec.Credentials.
func (r *Runtime) resolver(ctx context.Context, spec noderuntime.ImageSpec, ref schemas.ImageRef) (remotes.Resolver, *pullAuth) {
	p := &pullAuth{ctx: ctx, registry: ref.Registry(), ask: spec.Credentials, answers: map[string]noderuntime.RegistryCredential{}}
	authz := docker.NewDockerAuthorizer(docker.WithAuthClient(http.DefaultClient), docker.WithAuthCreds(p.creds))
	return docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithAuthorizer(authz), docker.WithPlainHTTP(r.plainHTTP)),
	}), p
}

// authFailure turns a failed pull into ErrRegistryAuth when the registry
// refused it for its credentials: a 401 or 403 answer, or a challenge the
// credential given (or none) could not meet, or a credential that could
// not be had. The message names the registry and what to do, never the
// credential. Any other error is returned as it is.
func (p *pullAuth) authFailure(err error, reference string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var status remoteerrors.ErrUnexpectedStatus
	refused := errors.As(err, &status) && (status.StatusCode == http.StatusUnauthorized || status.StatusCode == http.StatusForbidden)
	switch {
	case p.err != nil:
		return fmt.Errorf("%w: registry %s demanded a credential to pull %s and none could be had: %w; "+
			"give `warmfleet serve` a credential for %s (--registry-auth or --registry-credential-helper) that can pull it",
			noderuntime.ErrRegistryAuth, p.registry, reference, p.err, p.registry)
	case refused, errors.Is(err, docker.ErrInvalidAuthorization), errors.Is(err, noderuntime.ErrRegistryAuth),
		p.challenged && errdefs.IsNotImplemented(err): // a challenge met with no credential
		what := "with the credential the control plane gave"
		if !p.hasCredential() {
			what = "without a credential (the control plane holds none for it)"
		}
		return fmt.Errorf("%w: registry %s refused to serve %s %s; give `warmfleet serve --registry-auth` (or a --registry-credential-helper) a credential for %s that can pull that repository",
			noderuntime.ErrRegistryAuth, p.registry, reference, what, p.registry)
	}
	return err
}

// hasCredential says whether any answer gave a credential. p.mu is held.
func (p *pullAuth) hasCredential() bool {
	for _, c := range p.answers {
		if !c.Anonymous {
			return true
		}
	}
	return false
}
