package secrets

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/schemas"
)

// Service answers the per-tenant secret services on the request server,
// the tenant read off the subject (wf.tenant.<t>.secret.set|list|rm; the
// auth callout lets a producer publish under its own tenant only), and the
// operators' wf.admin.secret.rotate-key. No reply carries a value, and no
// log line either: a refused body is logged by its code alone.
type Service struct {
	store *Store
	nc    *nats.Conn
	log   *zap.Logger
}

// NewService returns the service over store.
func NewService(store *Store, nc *nats.Conn, log *zap.Logger) *Service {
	return &Service{store: store, nc: nc, log: log}
}

// anyTenant is op's subject for every tenant: the request server's
// subscription.
func anyTenant(op string) string { return bus.TenantSubject("*", op) }

// Serve subscribes until ctx ends or stop is called; the request workers
// are owned by wg.
func (s *Service) Serve(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	list := requests.Coded(anyTenant(bus.TenantSecretLs), "body is not a SecretListRequest", (*schemas.SecretListRequest).Validate, s.list, s.log)
	list.Empty = true
	rotate := requests.Coded(bus.SubjectSecretRotateKey, "body is not a RotateKeyRequest", (*schemas.RotateKeyRequest).Validate, s.rotate, s.log)
	rotate.Empty = true
	// A re-seal of every secret may take a while; one at a time is enough.
	rotate.Pool.Workers, rotate.Pool.Queue = 1, 4
	set := requests.Coded(anyTenant(bus.TenantSecretSet), "body is not a SecretSetRequest", (*schemas.SecretSetRequest).Validate, s.set, s.log)
	set.What = "secret set"
	return requests.Serve(ctx, wg, s.nc, set, list,
		requests.Coded(anyTenant(bus.TenantSecretRm), "body is not a SecretRemoveRequest", (*schemas.SecretRemoveRequest).Validate, s.remove, s.log),
		rotate)
}

func (s *Service) set(ctx context.Context, subject string, req schemas.SecretSetRequest) (schemas.SecretInfo, error) {
	defer clear(req.Value)
	info, err := s.store.Set(ctx, bus.SubjectTenant(subject), req.Name, req.Value)
	if err == nil {
		s.log.Info("secret set", zap.String("tenant", info.Tenant), zap.String("name", info.Name), zap.String("key_id", info.KeyID))
	}
	return info, s.logged(subject, err)
}

func (s *Service) list(ctx context.Context, subject string, _ schemas.SecretListRequest) (schemas.SecretListReply, error) {
	tenant := bus.SubjectTenant(subject)
	infos, err := s.store.List(ctx, tenant)
	return schemas.SecretListReply{Tenant: tenant, Secrets: infos}, s.logged(subject, err)
}

func (s *Service) remove(ctx context.Context, subject string, req schemas.SecretRemoveRequest) (schemas.SecretInfo, error) {
	info, err := s.store.Remove(ctx, bus.SubjectTenant(subject), req.Name)
	if err == nil {
		s.log.Info("secret removed", zap.String("tenant", info.Tenant), zap.String("name", info.Name))
	}
	return info, s.logged(subject, err)
}

func (s *Service) rotate(ctx context.Context, subject string, _ schemas.RotateKeyRequest) (schemas.RotateKeyReply, error) {
	rep, err := s.store.Reseal(ctx)
	return rep, s.logged(subject, err)
}

// logged logs a failure that is the control plane's, not the request's.
// The store's errors never carry a value.
func (s *Service) logged(subject string, err error) error {
	if err != nil && schemas.AsRefusal(err).Code == schemas.CodeInternal {
		s.log.Warn("secret request failed", zap.String("subject", subject), zap.Error(err))
	}
	return err
}
