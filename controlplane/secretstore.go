package controlplane

import (
	"context"
	"fmt"

	"github.com/warmfleet/warmfleet/controlplane/secretauth"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
)

// openSecrets loads Config.SecretsKeyFile and opens the sealed secret
// store over wf_secrets; nothing without a key file.
func (cp *ControlPlane) openSecrets(ctx context.Context) error {
	if cp.cfg.SecretsKeyFile == "" {
		return nil
	}
	log := cp.log.Named("secrets")
	keys, err := secrets.LoadKeyFile(cp.cfg.SecretsKeyFile, log)
	if err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if cp.secrets, err = secrets.OpenStore(ctx, cp.conn.JS, keys, cp.cfg.Tenants, cp.cfg.Now, log); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	cp.secretsService = secrets.NewService(cp.secrets, cp.conn.NC, log)
	// The service that hands booked attempts their secret values.
	cp.secretAuth = secretauth.NewService(cp.conn, cp.cache, cp.nodesKV, cp.runsKV, cp.secrets, cp.cfg.CredentialLimit, cp.cfg.Now, cp.log)
	return nil
}

// Secrets is the sealed secret store (intake checks a Run's secrets
// exist in it; the node credential service opens them); nil without
// Config.SecretsKeyFile.
func (cp *ControlPlane) Secrets() *secrets.Store { return cp.secrets }
