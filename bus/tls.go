package bus

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// TLSFiles names the PEM files of one side of a TLS connection.
//
// On the server (the embedded nats-server): CertFile and KeyFile are the
// server's certificate and key; CAFile, with VerifyClients, is the CA
// client certificates must chain to.
//
// On a client: CAFile is the CA the server's certificate must chain to
// (empty: the system roots); CertFile and KeyFile, when set, are the
// client's own certificate for servers that verify clients.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
	// VerifyClients (server side) requires every client to present a
	// certificate signed by CAFile.
	VerifyClients bool
	// CAPEM (client side) is the CA certificate itself, in PEM, used when
	// CAFile is empty: the one a node bootstrap carries.
	CAPEM string
}

// Enabled reports whether any file is named.
func (t TLSFiles) Enabled() bool {
	return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" || t.CAPEM != ""
}

// ErrTLSConfig is wrapped by every TLS setup error.
var ErrTLSConfig = errors.New("bus: tls")

// ServerConfig is the server side's tls.Config.
func (t TLSFiles) ServerConfig() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, fmt.Errorf("%w: the server needs both a certificate and a key file (--tls-cert, --tls-key)", ErrTLSConfig)
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: load server certificate %s / key %s: %w", ErrTLSConfig, t.CertFile, t.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.VerifyClients {
		if t.CAFile == "" {
			return nil, fmt.Errorf("%w: verifying clients needs the CA that signs their certificates (--tls-ca)", ErrTLSConfig)
		}
		pool, err := loadPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientConfig is a client's tls.Config.
func (t TLSFiles) ClientConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pool, err := loadPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	} else if t.CAPEM != "" {
		pool, err := poolFromPEM([]byte(t.CAPEM), "the bootstrap's control_plane_ca")
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both --tls-cert and --tls-key", ErrTLSConfig)
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: load client certificate %s / key %s: %w", ErrTLSConfig, t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// ClientOptions are the nats.Options that make a connection TLS with these
// files; none when no file is named.
func (t TLSFiles) ClientOptions() ([]nats.Option, error) {
	if !t.Enabled() {
		return nil, nil
	}
	cfg, err := t.ClientConfig()
	if err != nil {
		return nil, err
	}
	return []nats.Option{nats.Secure(cfg)}, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: read CA file: %w", ErrTLSConfig, err)
	}
	return poolFromPEM(pem, caFile)
}

// poolFromPEM is a pool of the certificates in pem, which what names.
func poolFromPEM(pem []byte, what string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrTLSConfig, what)
	}
	return pool, nil
}
