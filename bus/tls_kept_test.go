package bus

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestEnsurePKIKeepsAndReissues: the first call makes a CA and a server
// certificate (keys 0600); a second with the same hosts changes nothing; one
// naming a new address keeps the CA and re-issues the server certificate
// from it, so a client trusting the first ca.pem still connects; and the
// certificate is used by the embedded server.
func TestEnsurePKIKeepsAndReissues(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	first, err := EnsurePKI(dir, []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Reissued {
		t.Fatal("first call: want a new server certificate")
	}
	for _, f := range []string{first.CAKey, first.ServerKey} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v (%v), want 0600", f, st.Mode().Perm(), err)
		}
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: mode %v, want 0700", dir, st.Mode().Perm())
	}
	caBefore, _ := os.ReadFile(first.CAFile)
	certBefore, _ := os.ReadFile(first.ServerCert)

	again, err := EnsurePKI(dir, []string{"localhost", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if certNow, _ := os.ReadFile(again.ServerCert); again.Reissued || string(certNow) != string(certBefore) {
		t.Fatal("same hosts: the kept server certificate was replaced")
	}

	wider, err := EnsurePKI(dir, []string{"127.0.0.1", "localhost", "10.9.8.7", "cp.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	caNow, _ := os.ReadFile(wider.CAFile)
	if !wider.Reissued || string(caNow) != string(caBefore) {
		t.Fatalf("new address: reissued %v, CA kept %v; want a new server certificate from the same CA", wider.Reissued, string(caNow) == string(caBefore))
	}
	leaf := parseCertFile(t, wider.ServerCert)
	for _, h := range []string{"10.9.8.7", "cp.example.test", "127.0.0.1"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("re-issued certificate does not name %s: %v", h, err)
		}
	}
	if err := leaf.CheckSignatureFrom(parseCertFile(t, first.CAFile)); err != nil {
		t.Fatalf("re-issued certificate is not signed by the kept CA: %v", err)
	}

	// A server certificate the CA did not sign (replaced by hand) is re-issued.
	other, err := GenerateDevPKI(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, other.ServerCert, wider.ServerCert)
	copyFile(t, other.ServerKey, wider.ServerKey)
	if p, err := EnsurePKI(dir, []string{"127.0.0.1"}); err != nil || !p.Reissued {
		t.Fatalf("foreign server certificate: reissued %v, %v; want re-issued", p.Reissued, err)
	}

	srv, err := StartEmbedded(EmbeddedOptions{StoreDir: t.TempDir(), Port: -1, TLS: wider.Server()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	opts, err := TLSFiles{CAFile: first.CAFile}.ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL(), opts...)
	if err != nil {
		t.Fatalf("client trusting the first ca.pem: %v", err)
	}
	nc.Close()
	pemCA, err := CAPEM(first.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	opts, _ = TLSFiles{CAPEM: pemCA}.ClientOptions()
	if nc, err = nats.Connect(srv.URL(), opts...); err != nil {
		t.Fatalf("client given the CA's PEM: %v", err)
	}
	nc.Close()
}

// TestHostsFor: loopback always; a wildcard adds every interface address,
// a named address only itself.
func TestHostsFor(t *testing.T) {
	named := HostsFor("10.1.2.3")
	for _, h := range []string{"127.0.0.1", "::1", "localhost", "10.1.2.3"} {
		if !slices.Contains(named, h) {
			t.Errorf("HostsFor(10.1.2.3) = %v: missing %s", named, h)
		}
	}
	if slices.Contains(HostsFor("127.0.0.1"), "10.1.2.3") {
		t.Error("loopback listen names another address")
	}
	if len(HostsFor("0.0.0.0")) < 3 {
		t.Errorf("HostsFor(0.0.0.0) = %v", HostsFor("0.0.0.0"))
	}
}

func parseCertFile(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
