package containerd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/remotes/docker"
	remoteerrors "github.com/containerd/containerd/remotes/errors"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// registry pulls images from their registries, over plain HTTP where told
// to, authenticating through each ImageSpec's Credentials.
type registry struct {
	client      *ctrd.Client
	snapshotter string          // a pull that unpacks unpacks into it
	insecure    map[string]bool // Options.InsecureRegistries, canonical
	imageDir    string          // named when a pull fails: it was looked in first
}

func newRegistry(client *ctrd.Client, snapshotter, imageDir string, insecure []string) *registry {
	r := &registry{client: client, snapshotter: snapshotter, imageDir: imageDir, insecure: map[string]bool{}}
	for _, h := range insecure {
		r.insecure[schemas.CanonicalRegistry(h)] = true
	}
	return r
}

// plainHTTP says whether a registry host is spoken to over plain HTTP:
// loopback hosts (containerd's own default) and the hosts
// Options.InsecureRegistries names.
func (r *registry) plainHTTP(host string) (bool, error) {
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
func (r *registry) resolver(ctx context.Context, spec noderuntime.ImageSpec, ref schemas.ImageRef) (remotes.Resolver, *pullAuth) {
	p := &pullAuth{ctx: ctx, registry: ref.Registry(), ask: spec.Credentials, answers: map[string]noderuntime.RegistryCredential{}}
	authz := docker.NewDockerAuthorizer(docker.WithAuthClient(http.DefaultClient), docker.WithAuthCreds(p.creds))
	return docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithAuthorizer(authz), docker.WithPlainHTTP(r.plainHTTP)),
	}), p
}

// pull fetches p's build from the reference's registry, counting bytes it
// had to download (content already present is not fetched again). Of an
// index, containerd fetches the one manifest the matcher picks first and
// only its config and layers.
func (r *registry) pull(ctx context.Context, spec noderuntime.ImageSpec, want digest.Digest) (int64, error) {
	// Our own lease keeps what the pull fetched (the index above all) until
	// it is checked below, whether or not containerd named an image.
	ctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return 0, fmt.Errorf("lease for pull: %w", err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	cs := r.client.ContentStore()
	// Whether a record already carried this name: only one this pull made
	// is removed below.
	_, err = r.client.ImageService().Get(ctx, spec.Reference)
	named := !errdefs.IsNotFound(err)
	var fetched atomic.Int64
	count := images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		// Runs before the fetch handler, so absent content is about to be downloaded.
		if _, err := cs.Info(ctx, desc.Digest); errdefs.IsNotFound(err) {
			fetched.Add(desc.Size)
		}
		return nil, nil
	})
	ref, err := schemas.ParseImageRef("reference", spec.Reference)
	if err != nil {
		return 0, fmt.Errorf("pull %s: %w", spec.Reference, err)
	}
	resolver, auth := r.resolver(ctx, spec, ref)
	opts := []ctrd.RemoteOpt{
		ctrd.WithResolver(resolver),
		ctrd.WithImageHandler(count),
		ctrd.WithPlatformMatcher(platformMatcher(spec.Platform)),
		ctrd.WithPullSnapshotter(r.snapshotter),
	}
	if spec.Unpack {
		opts = append(opts, ctrd.WithPullUnpack)
	}
	if spec.Progress != nil {
		var p pullProgress
		opts = append(opts, ctrd.WithImageHandlerWrapper(p.wrap(cs)))
		pctx, stop := context.WithCancel(ctx)
		polled := make(chan struct{})
		go func() { defer close(polled); p.poll(pctx, cs, 250*time.Millisecond, spec.Progress) }()
		defer func() { stop(); <-polled }()
	}
	img, err := r.client.Pull(ctx, spec.Reference, opts...)
	// An index without p's build pulls as the index alone (or fails to
	// unpack): say so, and leave no record naming it.
	if target, ok := storedDescriptor(ctx, cs, want); ok {
		if _, berr := buildFor(ctx, cs, target, spec.Platform); errors.Is(berr, noderuntime.ErrPlatformNotInImage) {
			if !named {
				_ = r.client.ImageService().Delete(ctx, spec.Reference)
			}
			return 0, berr
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("pull %s: %w", spec.Reference, ctx.Err())
		}
		if err := auth.authFailure(err, spec.Reference); errors.Is(err, noderuntime.ErrRegistryAuth) {
			return 0, err
		}
		// The error carries the registry's answer but never a credential:
		// the authorizer sends it in a header the client does not log.
		return 0, fmt.Errorf("%w: %s is neither in containerd nor in image dir %q, and pulling it failed: %w",
			noderuntime.ErrImageNotFound, spec.Reference, r.imageDir, err)
	}
	if got := img.Target().Digest; got != want {
		_ = r.client.ImageService().Delete(ctx, img.Name())
		return 0, fmt.Errorf("%w: registry served %s for %s, the run pins %s", ErrDigestMismatch, got, spec.Reference, want)
	}
	return fetched.Load(), nil
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
