package artifacts

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// Service answers operators' catalog changes on wf.admin.artifact.register
// and wf.admin.artifact.rm, on the request server. Replies are
// schemas.Reply[schemas.ArtifactRecord] in the request's encoding.
type Service struct {
	cat *Catalog
	nc  *nats.Conn
	log *zap.Logger
	// tenants are the configured tenants a record may belong to.
	tenants []string
}

// NewService returns the service over cat. tenants are the configured
// tenants (controlplane.Config.Tenants) a registration may name; none:
// only DefaultTenant.
func NewService(cat *Catalog, nc *nats.Conn, log *zap.Logger, tenants ...string) *Service {
	if len(tenants) == 0 {
		tenants = []string{schemas.DefaultTenant}
	}
	return &Service{cat: cat, nc: nc, log: log, tenants: slices.Clone(tenants)}
}

// Serve subscribes until ctx ends or stop is called; the request workers
// are owned by wg.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	return requests.Serve(ctx, wg, s.nc,
		requests.Coded(bus.SubjectArtifactRegister, "body is not an ArtifactRegistration", (*schemas.ArtifactRegistration).Validate, s.register, s.log),
		requests.Coded(bus.SubjectArtifactRemove, "body is not an ArtifactRemoval", (*schemas.ArtifactRemoval).Validate, s.remove, s.log))
}

func (s *Service) register(ctx context.Context, subject string, reg schemas.ArtifactRegistration) (schemas.ArtifactRecord, error) {
	if t := reg.Record.TenantOf(); !slices.Contains(s.tenants, t) {
		return reg.Record, &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "tenant",
			Reason: fmt.Sprintf("this control plane has no tenant %q (it has %s); name one of them with --tenant, or add the tenant to `serve --producer-tokens-file` and restart", t, strings.Join(s.tenants, ", "))}
	}
	rec, err := s.cat.Register(ctx, reg.Record)
	return rec, s.logged(subject, err)
}

func (s *Service) remove(ctx context.Context, subject string, rm schemas.ArtifactRemoval) (schemas.ArtifactRecord, error) {
	rec, err := s.cat.Remove(ctx, rm.Name, rm.ArtifactVersion)
	return rec, s.logged(subject, err)
}

// logged logs a failure that is the control plane's, not the request's.
func (s *Service) logged(subject string, err error) error {
	if err != nil && schemas.AsRefusal(err).Code == schemas.CodeInternal {
		s.log.Warn("artifact request failed", zap.String("subject", subject), zap.Error(err))
	}
	return err
}
