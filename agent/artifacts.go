package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/agent/creds"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrArtifactLogin: the artifact login the control plane gave was refused
// or could not connect.
var ErrArtifactLogin = errors.New("agent: the artifact login failed")

// replicas makes verified artifact replicas present in the node's store,
// fetching each from its source under a credential asked for that fetch.
type replicas struct {
	store *artifactstore.Store
	creds *creds.Asker
	// js is the agent's own JetStream: it reads the object store without
	// NATS auth. nc names the servers an artifact login dials when
	// transport is nil.
	js        jetstream.JetStream
	nc        *nats.Conn
	transport *bus.Transport
	// authOn: the agent logs in to NATS, so object-store reads go through
	// a login scoped to the one consumer of each read.
	authOn  bool
	http    *http.Client // nil: a client that bounds the wait for a response
	nodeID  string
	changed func() // a new replica is stored: facts should say so soon
	log     *zap.Logger
}

// ensure makes a verified replica of m present. Its source's credential is
// asked for only when bytes must actually be fetched.
func (r *replicas) ensure(ctx context.Context, m schemas.ArtifactMount, runID, prefetchID string, progress func(done, total int64)) (artifactstore.Result, error) {
	src := &credentialedSource{r: r, content: m, runID: runID, prefetchID: prefetchID}
	defer src.close()
	res, err := r.store.Ensure(ctx, artifactstore.Want{Digest: m.Digest, SizeBytes: m.SizeBytes, Source: src, Progress: progress})
	if err == nil {
		if terr := r.store.Touch(m.Digest); terr != nil {
			r.log.Warn("artifact use not recorded", zap.String("digest", m.Digest), zap.Error(terr))
		}
	}
	if err == nil && !res.AlreadyPresent {
		// A new replica: placement should hear of it before the next
		// periodic report.
		r.changed()
	}
	return res, err
}

// credentialedSource opens an artifact's source under a credential the
// control plane gives for this fetch; it asks again after the source
// refused one, and for every Open of an object: the consumer the control
// plane created for a read serves that read only. The credential lives in
// memory until the next ask or close.
type credentialedSource struct {
	r                 *replicas
	content           schemas.ArtifactMount
	runID, prefetchID string

	mu     sync.Mutex
	inner  artifactstore.Source
	closer func()
}

func (s *credentialedSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inner != nil && s.content.Source.Object != "" {
		s.reset()
	}
	if s.inner == nil {
		inner, closer, err := s.r.openSource(ctx, s.content, s.runID, s.prefetchID, offset)
		if err != nil {
			return nil, err
		}
		s.inner, s.closer = inner, closer
	}
	rc, err := s.inner.Open(ctx, offset)
	if errors.Is(err, artifactstore.ErrSourceAuth) {
		s.reset()
	}
	return rc, err
}

func (s *credentialedSource) reset() {
	if s.closer != nil {
		s.closer()
	}
	s.inner, s.closer = nil, nil
}

func (s *credentialedSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
}

// openSource asks the control plane for the credential of a fetch from
// offset and builds the source it opens: for an object, the pull consumer
// the control plane created (read under a login allowed to pull it and
// nothing else, or, without NATS auth, a development bus, on the agent's
// own connection); for a URL, its headers.
func (r *replicas) openSource(ctx context.Context, m schemas.ArtifactMount, runID, prefetchID string, offset int64) (artifactstore.Source, func(), error) {
	cred, err := r.creds.Artifact(ctx, m.Digest, runID, prefetchID, offset)
	if err != nil {
		return nil, nil, err
	}
	if m.Source.URL != "" {
		return artifactstore.NewURLSource(r.httpClient(), m.Source.URL, cred.Headers), func() {}, nil
	}
	if cred.Object == nil {
		return nil, nil, &ArtifactCredentialError{Digest: m.Digest, Err: errors.New("the control plane's answer names no consumer to read the object from")}
	}
	if !r.authOn {
		return artifactstore.NewObjectSource(r.js, bus.ObjectBucketArtifacts, *cred.Object, m.Digest), func() {}, nil
	}
	if cred.Login == nil {
		return nil, nil, &ArtifactCredentialError{Digest: m.Digest, Err: errors.New("the control plane's answer holds no login for the object store")}
	}
	nc, err := r.dialLogin(ctx, *cred.Login)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: log in to read %s: %w", ErrArtifactLogin, m.Digest, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("agent: jetstream for the artifact login: %w", err)
	}
	return artifactstore.NewObjectSource(js, bus.ObjectBucketArtifacts, *cred.Object, m.Digest), nc.Close, nil
}

// dialLogin opens the connection of an object-store login
// (bus.DialArtifactLogin) over the artifact transport. The caller closes
// it after the fetch.
func (r *replicas) dialLogin(ctx context.Context, login schemas.ArtifactLogin) (*nats.Conn, error) {
	tr := r.transport
	if tr == nil {
		t := bus.TransportOf(r.nc)
		tr = &t
	}
	return bus.DialArtifactLogin(ctx, *tr, r.nodeID, login.User, login.Token)
}

// httpClient is the client URL sources are fetched with: no overall
// timeout (a fetch may take an hour), but bounded waits for a response.
func (r *replicas) httpClient() *http.Client {
	if r.http != nil {
		return r.http
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = time.Minute
	return &http.Client{Transport: t}
}

// artifactFailureCode is the coded reason an artifact that could not be
// ensured fails its Run with.
func artifactFailureCode(err error) schemas.Code {
	switch {
	case errors.Is(err, artifactstore.ErrDigestMismatch):
		return schemas.CodeArtifactDigestMismatch
	case errors.Is(err, artifactstore.ErrSourceAuth), errors.Is(err, ErrArtifactLogin), errors.As(err, new(*ArtifactCredentialError)):
		return schemas.CodeArtifactSourceAuthFailed
	}
	return schemas.CodeArtifactFetchFailed
}
