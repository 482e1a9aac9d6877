package bus

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// KeptPKI is the CA and server certificate `warmfleet serve --auth` makes
// for its embedded server when it is given none, kept under one directory
// so every restart presents a certificate the same CA signed: agents and
// CLIs that trust ca.pem keep trusting the server.
type KeptPKI struct {
	CAFile, CAKey         string
	ServerCert, ServerKey string
	// Reissued is true when this call wrote a new server certificate (none
	// was kept, it expired soon, or it did not name every host).
	Reissued bool
}

// Server is the embedded server's files (clients are not verified).
func (p KeptPKI) Server() TLSFiles {
	return TLSFiles{CertFile: p.ServerCert, KeyFile: p.ServerKey, CAFile: p.CAFile}
}

// Lifetimes of what EnsurePKI makes: the CA outlives many server
// certificates, and a server certificate is re-issued a month before it
// ends.
const (
	keptCAValidity     = 10 * 365 * 24 * time.Hour
	keptServerValidity = 2 * 365 * 24 * time.Hour
	keptServerRenew    = 30 * 24 * time.Hour
)

// EnsurePKI keeps a CA (ca.pem, ca-key.pem) and a server certificate
// (server.pem, server-key.pem) under dir, making what is missing. Keys are
// 0600 in a 0700 directory. The CA is reused as long as it is there; the
// server certificate is re-issued from it when it is missing, not signed by
// it, ends within a month, or does not cover every one of hosts (names and
// IP addresses).
func EnsurePKI(dir string, hosts []string) (KeptPKI, error) {
	p := KeptPKI{
		CAFile: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, fmt.Errorf("%w: %s: %w", ErrTLSConfig, dir, err)
	}
	ca, err := loadCA(p.CAFile, p.CAKey)
	if os.IsNotExist(err) {
		if ca, err = newCA(keptCAValidity); err != nil {
			return p, err
		}
		kb, err := x509.MarshalECPrivateKey(ca.key)
		if err != nil {
			return p, err
		}
		if err := writePEM(p.CAKey, "EC PRIVATE KEY", kb, 0o600); err != nil {
			return p, err
		}
		if err := writePEM(p.CAFile, "CERTIFICATE", ca.cert.Raw, 0o644); err != nil {
			return p, err
		}
	} else if err != nil {
		return p, err
	}
	if serverCovers(p.ServerCert, p.ServerKey, ca.cert, hosts) {
		return p, nil
	}
	p.Reissued = true
	return p, ca.issue("warmfleet nats server", x509.ExtKeyUsageServerAuth, hosts, keptServerValidity, p.ServerCert, p.ServerKey)
}

// loadCA reads a kept CA; an error satisfying os.IsNotExist means there is
// none yet.
func loadCA(certFile, keyFile string) (certAuthority, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		if _, statErr := os.Stat(certFile); os.IsNotExist(statErr) {
			return certAuthority{}, statErr
		}
		return certAuthority{}, fmt.Errorf("%w: kept CA %s / %s: %w (remove both to make a new CA; every agent then needs a new bootstrap)", ErrTLSConfig, certFile, keyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return certAuthority{}, fmt.Errorf("%w: kept CA %s: %w", ErrTLSConfig, certFile, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA {
		return certAuthority{}, fmt.Errorf("%w: kept CA %s is not an ECDSA certificate authority", ErrTLSConfig, certFile)
	}
	return certAuthority{cert: cert, key: key}, nil
}

// serverCovers reports whether the kept server certificate and key exist,
// match, chain to ca, stay valid beyond the renewal margin and name every
// host.
func serverCovers(certFile, keyFile string, ca *x509.Certificate, hosts []string) bool {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || leaf.CheckSignatureFrom(ca) != nil || time.Until(leaf.NotAfter) < keptServerRenew {
		return false
	}
	for _, h := range hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// CAPEM reads a CA file's PEM, checking it holds a certificate, for
// handing to clients (it is public).
func CAPEM(caFile string) (string, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return "", fmt.Errorf("%w: read CA file: %w", ErrTLSConfig, err)
	}
	if blk, _ := pem.Decode(b); blk == nil || blk.Type != "CERTIFICATE" {
		return "", fmt.Errorf("%w: %s holds no PEM certificate", ErrTLSConfig, caFile)
	}
	return string(b), nil
}

// HostsFor are the names a server certificate needs for an address the
// server listens on: loopback, localhost, this host's name, and the
// address itself, or every interface address for a wildcard.
func HostsFor(listen string) []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	if ip := net.ParseIP(listen); listen == "" || (ip != nil && ip.IsUnspecified()) {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					hosts = append(hosts, n.IP.String())
				}
			}
		}
	} else {
		hosts = append(hosts, listen)
	}
	seen := map[string]bool{}
	out := hosts[:0]
	for _, h := range hosts {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}
