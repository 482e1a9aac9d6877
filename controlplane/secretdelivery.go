package controlplane

import (
	"errors"

	"github.com/warmfleet/warmfleet/controlplane/intake"
	"github.com/warmfleet/warmfleet/controlplane/secretauth"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
)

// secretDelivery makes, over the opened secret store, the service that
// hands booked attempts their secret values, and returns the store as
// intake's check that a Run's secrets exist. Without a store no secret is
// held: the check is nil, and intake refuses a Run naming one.
func (cp *ControlPlane) secretDelivery() intake.SecretChecker {
	if cp.secrets == nil {
		return nil
	}
	cp.secretAuth = secretauth.NewService(cp.conn, cp.cache, cp.nodesKV, cp.runsKV, cp.secrets,
		func(err error) bool { return errors.Is(err, secrets.ErrSecretNotFound) }, cp.cfg.CredentialLimit, cp.cfg.Now, cp.log)
	return cp.secrets
}
