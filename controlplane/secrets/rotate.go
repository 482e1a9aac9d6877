package secrets

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// errCurrent tells the CAS loop a secret is sealed under the sealing key.
var errCurrent = bus.ErrNoChange

// Reseal seals every secret that is not under the key file's sealing key
// again under it, each by CAS (a secret set meanwhile is sealed under it
// already). A secret that opens under no key of the file is counted as
// failed and left as it was: its key must come back to the file, or the
// secret be set again. Once Failed is 0, the old keys can leave the file.
func (s *Store) Reseal(ctx context.Context) (schemas.RotateKeyReply, error) {
	ring := s.keys.Keyring()
	rep := schemas.RotateKeyReply{KeyID: ring.SealingKeyID()}
	keys, err := s.listKeys(ctx, ">")
	if err != nil {
		return rep, err
	}
	for _, key := range keys {
		tenant, name, ok := strings.Cut(key, ".")
		if !ok {
			continue
		}
		err := s.reseal(ctx, ring, key, tenant, name)
		switch {
		case err == nil:
			rep.Resealed++
		case errors.Is(err, errCurrent):
			rep.Current++
		case errors.Is(err, ErrSecretNotFound):
			// Removed meanwhile.
		case errors.Is(err, ErrUnknownKey), errors.Is(err, ErrBrokenSeal):
			rep.Failed++
			if len(rep.FailedSecrets) < schemas.MaxRotateFailures {
				rep.FailedSecrets = append(rep.FailedSecrets, key)
			}
			s.log.Error("secret not re-sealed", zap.String("secret", key), zap.Error(err))
		default:
			return rep, err
		}
	}
	s.log.Info("secrets re-sealed", zap.String("sealing_key", rep.KeyID), zap.Int("resealed", rep.Resealed),
		zap.Int("current", rep.Current), zap.Int("failed", rep.Failed))
	return rep, nil
}

// reseal seals one secret again under ring's sealing key.
func (s *Store) reseal(ctx context.Context, ring *Keyring, key, tenant, name string) error {
	_, _, err := bus.UpdateJSON(ctx, s.kv, key, func(r *schemas.SealedSecret) error {
		if r.Tenant != tenant || r.Name != name {
			return fmt.Errorf("%w: stored record names %s", ErrBrokenSeal, schemas.SecretKey(r.Tenant, r.Name))
		}
		if r.KeyID == ring.SealingKeyID() {
			return errCurrent
		}
		v, err := ring.Open(r.KeyID, tenant, name, r.Sealed)
		if err != nil {
			return err
		}
		defer clear(v)
		keyID, sealed, err := ring.Seal(tenant, name, v)
		if err != nil {
			return err
		}
		r.KeyID, r.Sealed, r.UpdatedAt = keyID, sealed, s.now().UTC()
		return nil
	})
	if errors.Is(err, errCurrent) {
		return errCurrent
	}
	if err != nil && !errors.Is(err, ErrUnknownKey) && !errors.Is(err, ErrBrokenSeal) {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return ErrSecretNotFound
		}
		return fmt.Errorf("secrets: re-seal %s: %w", key, err)
	}
	return err
}
