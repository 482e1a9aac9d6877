package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// serveSecurity is `warmfleet serve`'s NATS auth and TLS (docs/security.md).
type serveSecurity struct {
	auth, insecureNoAuth      bool
	issuerSeedFile            string
	producerTokensFile        string
	operatorTokenFile         string
	natsUser, natsPassFile    string
	serverTLS                 bus.TLSFiles
	clientCert, clientKey     string
	serviceUser, servicePass  string // embedded: the control plane's own login
	issuerSeed                []byte
	producers                 map[string]admission.Producer
	operatorToken, issuerPubK string
}

func (s *serveSecurity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&s.auth, "auth", false, "require a login for NATS: agents, producers and operators get per-identity permissions from the control plane's auth callout (docs/security.md)")
	f.BoolVar(&s.insecureNoAuth, "insecure-no-auth", false, "let the embedded NATS listen beyond loopback without --auth: anyone who reaches the port may read and rewrite everything (a warning is logged at every start)")
	f.StringVar(&s.issuerSeedFile, "auth-issuer-seed-file", "", "account nkey seed (SA...) that signs callout answers; required with --auth and --nats-url (the server's auth_callout.issuer is its public key); the embedded server generates one")
	f.StringVar(&s.producerTokensFile, "producer-tokens-file", "", "with --auth: `file` of \"<name> <token> [<tenant>]\" lines, one per producer (no tenant: \"default\"); the tenants named are the ones this control plane serves")
	f.StringVar(&s.operatorTokenFile, "operator-token-file", "", "with --auth: file holding the operator token (user \"operator\", full permissions)")
	f.StringVar(&s.natsUser, "nats-user", "", "with --nats-url: the control plane's NATS user (listed in auth_callout.auth_users)")
	f.StringVar(&s.natsPassFile, "nats-password-file", "", "with --nats-url: file holding that user's password")
	f.StringVar(&s.serverTLS.CertFile, "tls-cert", "", "embedded NATS: server certificate (PEM); turns TLS on")
	f.StringVar(&s.serverTLS.KeyFile, "tls-key", "", "embedded NATS: server key (PEM)")
	f.StringVar(&s.serverTLS.CAFile, "tls-ca", "", "CA (PEM) that signs the server's certificate and, with --tls-verify-clients, clients' certificates")
	f.BoolVar(&s.serverTLS.VerifyClients, "tls-verify-clients", false, "embedded NATS: require a client certificate signed by --tls-ca")
	f.StringVar(&s.clientCert, "tls-client-cert", "", "the control plane's own client certificate (PEM), for a server that verifies clients")
	f.StringVar(&s.clientKey, "tls-client-key", "", "the control plane's own client key (PEM)")
}

// checkListen refuses an embedded server open beyond loopback without
// --auth, unless --insecure-no-auth says so, which is warned about at each
// start.
func (s *serveSecurity) checkListen(embedded bool, listen string, log *zap.Logger) error {
	if !embedded || s.auth || isLoopback(listen) {
		return nil
	}
	if !s.insecureNoAuth {
		return &schemas.Refusal{Code: schemas.CodeAuthRequired, Field: "--auth", Reason: fmt.Sprintf(
			"--listen %s is reachable beyond this machine, and without --auth anyone who reaches it reads and rewrites every Run, node and credential request: add --auth (agents then need --nats-auth), listen on 127.0.0.1, or pass --insecure-no-auth to run open anyway", listen)}
	}
	log.Warn("embedded NATS listens beyond loopback WITHOUT auth (--insecure-no-auth): anyone who reaches it may read and rewrite everything; use --auth", zap.String("listen", listen))
	return nil
}

// isLoopback reports whether listen (an IP or host name) is this machine only.
func isLoopback(listen string) bool {
	if listen == "localhost" {
		return true
	}
	ip := net.ParseIP(listen)
	return ip != nil && ip.IsLoopback()
}

// prepare reads the secret files and, for the embedded server, mints the
// control plane's login and the callout's issuer key, and, unless given
// certificate files, keeps a CA and server certificate under
// <data-dir>/tls so auth always comes with TLS. Secrets are never printed.
func (s *serveSecurity) prepare(embedded bool, dataDir, listen string, log *zap.Logger) error {
	if !s.auth {
		if s.producerTokensFile != "" || s.operatorTokenFile != "" || s.issuerSeedFile != "" {
			return errors.New("--producer-tokens-file, --operator-token-file and --auth-issuer-seed-file need --auth")
		}
		return nil
	}
	var err error
	if s.issuerSeedFile != "" {
		if s.issuerSeed, err = readSecretFile(s.issuerSeedFile, "--auth-issuer-seed-file"); err != nil {
			return err
		}
	} else if embedded {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			return err
		}
		if s.issuerSeed, err = kp.Seed(); err != nil {
			return err
		}
	} else {
		return errors.New("--auth with --nats-url needs --auth-issuer-seed-file: the seed of the account nkey named in the server's auth_callout.issuer (docs/security.md)")
	}
	kp, err := nkeys.FromSeed(s.issuerSeed)
	if err != nil {
		return fmt.Errorf("--auth-issuer-seed-file: not an nkey seed: %w", err)
	}
	if s.issuerPubK, err = kp.PublicKey(); err != nil {
		return err
	}
	if s.producerTokensFile != "" {
		b, err := os.ReadFile(s.producerTokensFile)
		if err != nil {
			return fmt.Errorf("--producer-tokens-file: %w", err)
		}
		if s.producers, err = admission.ParseProducerTokens(string(b)); err != nil {
			return fmt.Errorf("--producer-tokens-file %s: %w", s.producerTokensFile, err)
		}
	}
	if s.operatorTokenFile == "" && embedded && dataDir != "" {
		// An operator login for `make run`-style use: a token file beside
		// the store, readable by its owner only.
		if s.operatorTokenFile, err = ensureTokenFile(filepath.Join(dataDir, "operator.token")); err != nil {
			return err
		}
	}
	if s.operatorTokenFile != "" {
		b, err := readSecretFile(s.operatorTokenFile, "--operator-token-file")
		if err != nil {
			return err
		}
		s.operatorToken = string(b)
	}
	if embedded {
		s.serviceUser = "warmfleet-cp"
		s.servicePass = randid.Token(32)
		if s.serverTLS.CertFile == "" {
			if s.serverTLS.VerifyClients {
				return errors.New("--tls-verify-clients needs --tls-cert, --tls-key and --tls-ca: the CA serve keeps in <data-dir>/tls issues no client certificates")
			}
			pki, err := bus.EnsurePKI(filepath.Join(dataDir, "tls"), bus.HostsFor(listen))
			if err != nil {
				return fmt.Errorf("--auth without --tls-cert: the data dir's certificates: %w", err)
			}
			log.Info("embedded NATS TLS from the data dir", zap.String("ca", pki.CAFile), zap.String("cert", pki.ServerCert), zap.Bool("reissued", pki.Reissued))
			s.serverTLS = pki.Server()
		}
	} else {
		if s.natsUser == "" || s.natsPassFile == "" {
			return errors.New("--auth with --nats-url needs --nats-user and --nats-password-file: the control plane's own login, listed in the server's auth_callout.auth_users")
		}
		b, err := readSecretFile(s.natsPassFile, "--nats-password-file")
		if err != nil {
			return err
		}
		s.serviceUser, s.servicePass = s.natsUser, string(b)
	}
	return nil
}

// embeddedAuth is the embedded server's auth, nil without --auth.
func (s *serveSecurity) embeddedAuth() *bus.EmbeddedAuth {
	if !s.auth {
		return nil
	}
	return &bus.EmbeddedAuth{ServiceUser: s.serviceUser, ServicePassword: s.servicePass, Issuer: s.issuerPubK}
}

// clientOptions are the control plane's connection options: TLS when a CA
// or client certificate is named, its login with --auth.
func (s *serveSecurity) clientOptions() ([]nats.Option, error) {
	opts, err := bus.TLSFiles{CAFile: s.serverTLS.CAFile, CertFile: s.clientCert, KeyFile: s.clientKey}.ClientOptions()
	if err != nil {
		return nil, err
	}
	if s.serverTLS.CertFile != "" && s.serverTLS.CAFile == "" {
		return nil, errors.New("--tls-cert needs --tls-ca too: the control plane checks the embedded server's certificate against it")
	}
	if s.auth {
		opts = append(opts, nats.UserInfo(s.serviceUser, s.servicePass))
	}
	return opts, nil
}

// authConfig is the auth callout's configuration for controlplane.Config,
// nil without --auth.
func (s *serveSecurity) authConfig(log *zap.Logger) *admission.Config {
	if !s.auth {
		return nil
	}
	log.Info("NATS auth on", zap.Strings("producers", admission.ProducerNames(s.producers)), zap.Strings("tenants", s.tenants()), zap.String("operator_token_file", s.operatorTokenFile))
	return &admission.Config{IssuerSeed: s.issuerSeed, Producers: s.producers, OperatorToken: s.operatorToken}
}

// publish writes, for the embedded server with auth, the operator's login
// to <data-dir>/operator.json (0600) for the CLIs to find; without auth it
// removes one left from an earlier start, which would point them at TLS and
// a login this server does not have.
func (s *serveSecurity) publish(dataDir, url string, log *zap.Logger) error {
	path := filepath.Join(dataDir, bus.OperatorContextFile)
	if !s.auth || s.operatorToken == "" {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	c := bus.OperatorContext{Description: "warmfleet operator (written by warmfleet serve)", URL: url, User: bus.OperatorUser, Password: s.operatorToken}
	if s.serverTLS.CAFile != "" {
		ca, err := filepath.Abs(s.serverTLS.CAFile)
		if err != nil {
			return err
		}
		c.CA = ca
	}
	if err := bus.WriteOperatorContext(path, c); err != nil {
		return err
	}
	log.Info("operator login written for the CLIs", zap.String("file", path))
	return nil
}

// controlPlaneCA is the CA (PEM) node bootstraps carry: the one the
// server's certificate chains to, if any.
func (s *serveSecurity) controlPlaneCA() (string, error) {
	if s.serverTLS.CAFile == "" {
		return "", nil
	}
	return bus.CAPEM(s.serverTLS.CAFile)
}

// ensureTokenFile returns path, writing a new random token there (0600)
// unless it exists.
func ensureTokenFile(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(randid.Token(32)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write operator token: %w", err)
	}
	return path, nil
}

func readSecretFile(path, flag string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return nil, fmt.Errorf("%s %s is empty", flag, path)
	}
	return []byte(v), nil
}

// tenants are the tenants the producer tokens file names, with the default
// one, sorted (controlplane.Config.Tenants).
func (s *serveSecurity) tenants() []string { return admission.ProducerTenants(s.producers) }
