package secrets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// ErrSecretNotFound matches (errors.Is) the refusal of a secret the tenant
// does not hold: code secret_unknown, whatever field it names.
var ErrSecretNotFound error = &schemas.Refusal{Code: schemas.CodeSecretUnknown, Reason: "no such secret"}

// Keys gives the keyring to seal and open with, as it is now (*KeyFile).
type Keys interface{ Keyring() *Keyring }

// Store is the sealed secret store: wf_secrets, a schemas.SealedSecret by
// `<tenant>.<name>`, changed by CAS only. Values are sealed before they
// are written and opened only by Open; no error, log line or reply of the
// store carries one.
type Store struct {
	kv      jetstream.KeyValue
	keys    Keys
	tenants map[string]bool
	now     func() time.Time
	log     *zap.Logger
}

// NewStore is the store over kv (bus.BucketSecrets) for tenants.
func NewStore(kv jetstream.KeyValue, keys Keys, tenants []string, now func() time.Time, log *zap.Logger) *Store {
	s := &Store{kv: kv, keys: keys, tenants: map[string]bool{}, now: now, log: log}
	if s.now == nil {
		s.now = time.Now
	}
	for _, t := range tenants {
		s.tenants[t] = true
	}
	s.tenants[schemas.DefaultTenant] = true
	return s
}

// OpenStore opens wf_secrets (provisioned by bus.Provision) and returns the
// store over it.
func OpenStore(ctx context.Context, js jetstream.JetStream, keys Keys, tenants []string, now func() time.Time, log *zap.Logger) (*Store, error) {
	kv, err := js.KeyValue(ctx, bus.BucketSecrets)
	if err != nil {
		return nil, fmt.Errorf("secrets: open %s: %w", bus.BucketSecrets, err)
	}
	return NewStore(kv, keys, tenants, now, log), nil
}

// checkTenant refuses a tenant this control plane does not serve.
func (s *Store) checkTenant(tenant string) error {
	if err := schemas.ValidateTenant("tenant", tenant); err != nil {
		return err
	}
	if !s.tenants[tenant] {
		return &schemas.Refusal{Code: schemas.CodeTenantUnknown, Field: "tenant",
			Reason: "this control plane serves no such tenant; tenants come from serve's --producer-tokens-file (restart serve to add one)"}
	}
	return nil
}

func (s *Store) check(tenant, name string) error {
	if err := s.checkTenant(tenant); err != nil {
		return err
	}
	return schemas.ValidateSecretName("name", name)
}

func notFound(tenant, name string) error {
	return &schemas.Refusal{Code: schemas.CodeSecretUnknown, Field: "name",
		Reason: fmt.Sprintf("tenant %q holds no secret %q (`warmfleet secret list` names them)", tenant, name)}
}

// get reads one record; ErrSecretNotFound when absent.
func (s *Store) get(ctx context.Context, tenant, name string) (schemas.SealedSecret, uint64, error) {
	e, err := s.kv.Get(ctx, schemas.SecretKey(tenant, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return schemas.SealedSecret{}, 0, notFound(tenant, name)
	}
	if err != nil {
		return schemas.SealedSecret{}, 0, fmt.Errorf("secrets: read %s: %w", schemas.SecretKey(tenant, name), err)
	}
	rec, err := schemas.DecodeSealedSecret(e.Value())
	if err == nil && (rec.Tenant != tenant || rec.Name != name) {
		err = errors.New("record names another secret")
	}
	if err != nil {
		return schemas.SealedSecret{}, 0, fmt.Errorf("secrets: stored %s is not a sealed secret: %w", schemas.SecretKey(tenant, name), err)
	}
	return rec, e.Revision(), nil
}

// Exists reports whether tenant holds the secret name.
func (s *Store) Exists(ctx context.Context, tenant, name string) (bool, error) {
	if err := s.check(tenant, name); err != nil {
		return false, err
	}
	_, _, err := s.get(ctx, tenant, name)
	if errors.Is(err, ErrSecretNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Open is the value of tenant's secret name; ErrSecretNotFound when absent.
func (s *Store) Open(ctx context.Context, tenant, name string) ([]byte, error) {
	if err := s.check(tenant, name); err != nil {
		return nil, err
	}
	rec, _, err := s.get(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	v, err := s.keys.Keyring().Open(rec.KeyID, tenant, name, rec.Sealed)
	if err != nil {
		return nil, fmt.Errorf("secrets: open %s: %w", schemas.SecretKey(tenant, name), err)
	}
	return v, nil
}

// Set seals value as tenant's secret name, replacing its value if it has
// one (CAS), else creating it unless the tenant holds
// schemas.MaxSecretsPerTenant already.
func (s *Store) Set(ctx context.Context, tenant, name string, value []byte) (schemas.SecretInfo, error) {
	req := schemas.SecretSetRequest{Name: name, Value: value}
	if err := s.checkTenant(tenant); err != nil {
		return schemas.SecretInfo{}, err
	}
	if err := req.Validate(); err != nil {
		return schemas.SecretInfo{}, err
	}
	key := schemas.SecretKey(tenant, name)
	for range 8 {
		rec, _, err := bus.UpdateJSON(ctx, s.kv, key, func(r *schemas.SealedSecret) error {
			if r.Tenant != tenant || r.Name != name {
				return fmt.Errorf("stored record names %s", schemas.SecretKey(r.Tenant, r.Name))
			}
			return s.seal(r, value)
		})
		if err == nil {
			return rec.Info(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return schemas.SecretInfo{}, fmt.Errorf("secrets: set %s: %w", key, err)
		}
		if err := s.room(ctx, tenant); err != nil {
			return schemas.SecretInfo{}, err
		}
		now := s.now().UTC()
		fresh := schemas.SealedSecret{Tenant: tenant, Name: name, CreatedAt: now}
		if err := s.seal(&fresh, value); err != nil {
			return schemas.SecretInfo{}, err
		}
		_, err = bus.CreateJSON(ctx, s.kv, key, fresh)
		if err == nil {
			return fresh.Info(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return schemas.SecretInfo{}, fmt.Errorf("secrets: set %s: %w", key, err)
		}
		// Created meanwhile: update it instead.
	}
	return schemas.SecretInfo{}, fmt.Errorf("secrets: set %s: raced with other writers too often; try again", key)
}

// seal seals value into r under the current sealing key.
func (s *Store) seal(r *schemas.SealedSecret, value []byte) error {
	keyID, sealed, err := s.keys.Keyring().Seal(r.Tenant, r.Name, value)
	if err != nil {
		return err
	}
	r.KeyID, r.Sealed, r.Size, r.UpdatedAt = keyID, sealed, len(value), s.now().UTC()
	return nil
}

// room refuses a new secret of a tenant that holds the most it may. Two
// creates racing past it may both land: the limit bounds a tenant's
// growth, not its count to the secret.
func (s *Store) room(ctx context.Context, tenant string) error {
	keys, err := s.keysOf(ctx, tenant)
	if err != nil {
		return err
	}
	if len(keys) >= schemas.MaxSecretsPerTenant {
		return &schemas.Refusal{Code: schemas.CodeTooManySecrets, Field: "name",
			Reason: fmt.Sprintf("tenant %q holds %d secrets, the most it may; remove one first (`warmfleet secret rm`)", tenant, len(keys))}
	}
	return nil
}

// keysOf lists the bucket keys of tenant's secrets.
func (s *Store) keysOf(ctx context.Context, tenant string) ([]string, error) {
	return s.listKeys(ctx, tenant+".*")
}

func (s *Store) listKeys(ctx context.Context, filter string) ([]string, error) {
	l, err := s.kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: list %s: %w", filter, err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// List describes tenant's secrets by name, never their values.
func (s *Store) List(ctx context.Context, tenant string) ([]schemas.SecretInfo, error) {
	if err := s.checkTenant(tenant); err != nil {
		return nil, err
	}
	keys, err := s.keysOf(ctx, tenant)
	if err != nil {
		return nil, err
	}
	slices.Sort(keys)
	out := make([]schemas.SecretInfo, 0, len(keys))
	for _, k := range keys {
		rec, _, err := s.get(ctx, tenant, k[len(tenant)+1:])
		if errors.Is(err, ErrSecretNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec.Info())
	}
	return out, nil
}

// Remove deletes tenant's secret name at the revision read (CAS) and
// returns what it was.
func (s *Store) Remove(ctx context.Context, tenant, name string) (schemas.SecretInfo, error) {
	if err := s.check(tenant, name); err != nil {
		return schemas.SecretInfo{}, err
	}
	for range 8 {
		rec, rev, err := s.get(ctx, tenant, name)
		if err != nil {
			return schemas.SecretInfo{}, err
		}
		err = s.kv.Delete(ctx, schemas.SecretKey(tenant, name), jetstream.LastRevision(rev))
		if err == nil {
			return rec.Info(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return schemas.SecretInfo{}, fmt.Errorf("secrets: remove %s: %w", schemas.SecretKey(tenant, name), err)
		}
	}
	return schemas.SecretInfo{}, fmt.Errorf("secrets: remove %s: raced with other writers too often; try again", schemas.SecretKey(tenant, name))
}
