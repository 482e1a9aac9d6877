package bus

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// DevPKI is a throwaway certificate authority with one server and one
// client certificate, for tests and local trials. Production uses the
// operator's own CA (docs/security.md).
type DevPKI struct {
	CAFile                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// GenerateDevPKI writes ca.pem, server.pem/server-key.pem (valid for hosts:
// names and IP addresses) and client.pem/client-key.pem under dir. Keys are
// ECDSA P-256, written 0600; everything is valid for validFor.
func GenerateDevPKI(dir string, validFor time.Duration, hosts ...string) (DevPKI, error) {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "localhost"}
	}
	p := DevPKI{
		CAFile:     filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	ca, err := newCA(validFor)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.CAFile, "CERTIFICATE", ca.cert.Raw, 0o644); err != nil {
		return p, err
	}
	if err := ca.issue("warmfleet nats server", x509.ExtKeyUsageServerAuth, hosts, validFor, p.ServerCert, p.ServerKey); err != nil {
		return p, err
	}
	if err := ca.issue("warmfleet client", x509.ExtKeyUsageClientAuth, nil, validFor, p.ClientCert, p.ClientKey); err != nil {
		return p, err
	}
	return p, nil
}

// certAuthority is a CA certificate with its key, able to issue leaves.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(validFor time.Duration) (certAuthority, error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certAuthority{}, fmt.Errorf("%w: ca key: %w", ErrTLSConfig, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "warmfleet CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return certAuthority{}, fmt.Errorf("%w: ca certificate: %w", ErrTLSConfig, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return certAuthority{}, err
	}
	return certAuthority{cert: cert, key: key}, nil
}

// issue writes a leaf certificate for names (host names and IP addresses)
// and its key (0600).
func (ca certAuthority) issue(cn string, usage x509.ExtKeyUsage, names []string, validFor time.Duration, certFile, keyFile string) error {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("%w: key for %s: %w", ErrTLSConfig, cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	for _, h := range names {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("%w: certificate for %s: %w", ErrTLSConfig, cn, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kb, 0o600)
}

// Server is the server side's files, verifying clients when verify is set.
func (p DevPKI) Server(verify bool) TLSFiles {
	return TLSFiles{CertFile: p.ServerCert, KeyFile: p.ServerKey, CAFile: p.CAFile, VerifyClients: verify}
}

// Client is a client's files, with its client certificate.
func (p DevPKI) Client() TLSFiles {
	return TLSFiles{CertFile: p.ClientCert, KeyFile: p.ClientKey, CAFile: p.CAFile}
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("%w: write %s: %w", ErrTLSConfig, path, err)
	}
	return nil
}
