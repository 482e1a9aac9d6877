package prefetch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// answer answers wf.admin.prefetch: choose the nodes, record the
// prefetch, send each node its PrepareImage (or PrepareArtifact), reply
// the record. A request sent again (same request id) is answered with the
// record it made, and its commands not yet answered are sent again (the
// nodes apply each once).
func (s *Service) answer(ctx context.Context, _ string, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	if t := req.TenantOf(); !slices.Contains(s.tenants, t) {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "tenant",
			Reason: fmt.Sprintf("this control plane has no tenant %q (it has %s); name one of them, or add the tenant to `serve --producer-tokens-file` and restart", t, strings.Join(s.tenants, ", "))}
	}
	sel, err := ParseSelector(req.Nodes)
	if err != nil {
		return schemas.Prefetch{}, err
	}
	p, err := s.create(ctx, schemas.PrefetchIDFor(req.RequestID), req, sel)
	if err != nil {
		return schemas.Prefetch{}, err
	}
	return s.send(ctx, p), nil
}

// content is what a new prefetch warms: the request's image, or its
// artifact as the catalog resolves it now.
func (s *Service) content(ctx context.Context, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	if req.Artifact == "" {
		ref, _ := schemas.ParseImageRef("image", req.Image) // Validate parsed it
		return schemas.Prefetch{Tenant: req.TenantOf(), Image: ref.String(), ManifestDigest: ref.Digest}, nil
	}
	if s.artifacts == nil {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeArtifactUnknown, Field: "artifact",
			Reason: "this control plane has no artifact catalog, so it prefetches no artifact; prefetch an image instead"}
	}
	use, _ := schemas.ParseArtifactRef("artifact", req.Artifact) // Validate parsed it
	// Another tenant's artifact is unknown here, as a missing one is.
	ms, err := s.artifacts.Resolve(ctx, req.TenantOf(), []schemas.ArtifactUse{use})
	var r *schemas.Refusal
	switch {
	case errors.As(err, &r):
		// The catalog names the field of a Run's use; here it is ours.
		return schemas.Prefetch{}, &schemas.Refusal{Code: r.Code, Field: "artifact", Reason: r.Reason}
	case err != nil:
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: resolve: %w", use.Ref(), err)
	case len(ms) != 1:
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: the catalog answered %d artifacts for one", use.Ref(), len(ms))
	}
	m := ms[0]
	m.Path = "/prefetch" // a mount's rule wants a path; a prefetch mounts nothing
	if err := m.Validate("artifact"); err != nil {
		return schemas.Prefetch{}, fmt.Errorf("prefetch of artifact %s: the catalog answered an invalid record: %w", use.Ref(), err)
	}
	return schemas.Prefetch{Tenant: req.TenantOf(), Artifact: schemas.PrefetchArtifactOf(m)}, nil
}

// create stores a new prefetch record, or returns the one its request id
// already made.
func (s *Service) create(ctx context.Context, id string, req schemas.PrefetchRequest, sel Selector) (schemas.Prefetch, error) {
	if p, err := s.existing(ctx, id, req); err == nil || !errors.Is(err, jetstream.ErrKeyNotFound) {
		return p, err
	}
	p, err := s.content(ctx, req)
	if err != nil {
		return p, err
	}
	now := s.now()
	choose, what, noun := Choose, "the image hot", "node"
	if p.Artifact != nil {
		choose, what, noun = ChooseArtifact, "a replica of the artifact", "node that declares an artifact replica store"
	}
	plan, err := choose(s.cache.Nodes(), now, sel, req.Count, p.ContentDigest())
	if err != nil {
		return schemas.Prefetch{}, err
	}
	if len(plan.Targets) == 0 {
		why := "no live " + noun + " matches; `warmfleet node list` shows each node's state"
		if len(plan.Hot) > 0 {
			why = fmt.Sprintf("every matching live node (%d) already holds %s", len(plan.Hot), what)
		}
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeNoPrefetchTarget, Field: "nodes", Reason: why}
	}
	if len(plan.Targets)+len(plan.Skipped) > schemas.MaxPrefetchNodes {
		return schemas.Prefetch{}, &schemas.Refusal{Code: schemas.CodeTooManyItems, Field: "nodes",
			Reason: fmt.Sprintf("%d nodes match; one prefetch takes at most %d: narrow the selector or use --count", len(plan.Targets)+len(plan.Skipped), schemas.MaxPrefetchNodes)}
	}
	p.ID, p.RequestID, p.Selector, p.Count, p.CreatedAt, p.ExpiresAt = id, req.RequestID, sel.String(), req.Count, now, now.Add(req.Timeout())
	for _, n := range plan.Targets {
		p.Nodes = append(p.Nodes, schemas.PrefetchNode{NodeID: n, State: schemas.PrefetchSent, OperationID: OpID(id, n), UpdatedAt: now})
	}
	p.Nodes = append(p.Nodes, plan.Skipped...)
	raw, rev, err := bus.CreateJSONRaw(ctx, s.kv, id, p)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return s.existing(ctx, id, req) // another replica made it meanwhile
	}
	if err != nil {
		return schemas.Prefetch{}, fmt.Errorf("prefetch %s: store: %w", id, err)
	}
	s.note(p, rev, raw)
	s.log.Info("prefetch recorded", zap.String("prefetch_id", id), zap.String("content", p.Content()),
		zap.Int("nodes", len(plan.Targets)), zap.Int("skipped", len(plan.Skipped)))
	return p, nil
}

// existing reads a stored prefetch for a request sent again; another
// image or artifact under the same request id is refused. An artifact is
// matched as the request names it (not resolved again), so a request
// sent again answers the same record after the catalog gained a version.
func (s *Service) existing(ctx context.Context, id string, req schemas.PrefetchRequest) (schemas.Prefetch, error) {
	var p schemas.Prefetch
	if _, err := bus.GetJSON(ctx, s.kv, id, &p); err != nil {
		return p, err
	}
	same := false
	switch {
	case p.TenantOf() != req.TenantOf():
		// Another tenant's prefetch: the same refusal as other content.
	case req.Artifact == "":
		ref, _ := schemas.ParseImageRef("image", req.Image)
		same = p.Artifact == nil && ref.Digest == p.ManifestDigest
	case p.Artifact != nil:
		a := p.Artifact
		u, _ := schemas.ParseArtifactRef("artifact", req.Artifact)
		same = u.Name == a.Name && (u.Version == "" || u.Version == a.Version) && (u.Digest == "" || u.Digest == a.Digest)
	}
	if !same {
		return p, &schemas.Refusal{Code: schemas.CodeRequestIDConflict, Field: "request_id",
			Reason: "this request id already named a prefetch of another image, artifact or tenant; use a new request id"}
	}
	return p, nil
}

// sendOne sends a prefetch's command to one node.
func (s *Service) sendOne(ctx context.Context, p schemas.Prefetch, nodeID, opID string) error {
	if p.Artifact != nil {
		return s.dispatch.PrefetchArtifact(ctx, nodeID, opID, p.ID, p.Artifact.Mount())
	}
	ref, err := schemas.ParseImageRef("image", p.Image)
	if err != nil {
		return fmt.Errorf("prefetch %s: stored image: %w", p.ID, err)
	}
	return s.dispatch.Prefetch(ctx, nodeID, opID, p.ID, ref)
}

// send sends the command of every entry still waiting for its node. A
// node the command cannot reach has its entry failed.
func (s *Service) send(ctx context.Context, p schemas.Prefetch) schemas.Prefetch {
	if p.TimedOut(s.now()) {
		return p
	}
	for _, n := range p.Nodes {
		if n.State.Finished() {
			continue
		}
		err := s.sendOne(ctx, p, n.NodeID, n.OperationID)
		if err == nil {
			continue
		}
		s.log.Warn("prefetch command not sent", zap.String("prefetch_id", p.ID), zap.String("node_id", n.NodeID), zap.Error(err))
		if q, uerr := s.finish(ctx, p.ID, n.NodeID, n.OperationID, schemas.PrefetchFailed, schemas.CodeInternal, "the control plane could not send the command: "+err.Error()); uerr == nil {
			p = q
		}
	}
	return p
}
