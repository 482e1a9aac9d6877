package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/controlplane/secrets"
)

// serveSecrets is serve's key file for tenants' secrets.
type serveSecrets struct {
	keyFile string
}

func (s *serveSecrets) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.keyFile, "secrets-key-file", "",
		"key file tenants' secrets are sealed with (default <data-dir>/secrets.key, created 0600 with one fresh key when absent and NATS is embedded; "+
			"with --nats-url it must exist, the same file on every replica: `warmfleet secret new-key --key-file F` makes one)")
}

// build returns the key file's path, creating the default one for a
// control plane that embeds its NATS (the only replica). With --nats-url
// the replicas must share one file, so none is made up here: a replica
// with a key of its own would seal what the others cannot open.
func (s *serveSecrets) build(embedded bool, dataDir string, log *zap.Logger) (string, error) {
	path := s.keyFile
	if path == "" {
		path = filepath.Join(dataDir, "secrets.key")
	}
	if !embedded {
		if _, err := secrets.LoadKeyFile(path, log); err != nil {
			return "", fmt.Errorf("--secrets-key-file: %w (with --nats-url every replica loads the same key file: make it once with `warmfleet secret new-key --key-file %s` and copy it to each, mode 0600)", err, path)
		}
		return path, nil
	}
	created, err := secrets.EnsureKeyFile(path)
	if err != nil {
		return "", fmt.Errorf("--secrets-key-file: %w", err)
	}
	if created {
		log.Info("secrets key file created with one fresh key; back it up: secrets sealed with it open with no other", zap.String("path", path))
	}
	return path, nil
}
