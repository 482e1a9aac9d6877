package bus

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestEmbeddedTLS: with TLS files the embedded server takes only TLS
// clients, and with VerifyClients only those with a certificate from the CA.
func TestEmbeddedTLS(t *testing.T) {
	pki, err := GenerateDevPKI(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := StartEmbedded(EmbeddedOptions{StoreDir: t.TempDir(), Port: -1, TLS: pki.Server(true)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if !strings.HasPrefix(srv.URL(), "tls://") {
		t.Fatalf("URL %s: want tls://", srv.URL())
	}
	opts, err := pki.Client().ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL(), opts...)
	if err != nil {
		t.Fatalf("client with certificate: %v", err)
	}
	nc.Close()
	noCert, err := TLSFiles{CAFile: pki.CAFile}.ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(srv.URL(), noCert...); err == nil {
		nc.Close()
		t.Fatal("client without a certificate was accepted")
	}
	if nc, err := nats.Connect(strings.Replace(srv.URL(), "tls://", "nats://", 1)); err == nil {
		nc.Close()
		t.Fatal("plaintext client was accepted")
	}
	if _, err := (TLSFiles{CertFile: pki.ServerCert}).ServerConfig(); err == nil {
		t.Fatal("a server certificate without its key was accepted")
	}
}

func TestPermissionsStayOnTheirNode(t *testing.T) {
	for _, p := range [][]string{PermsNode("n1").Publish, PermsNode("n1").Subscribe, PermsEnrolling("n1").Publish, PermsEnrolling("n1").Subscribe} {
		for _, s := range p {
			if strings.Contains(s, "WF_INBOX") || s == SessionLogsSubject("*", ">") {
				continue // session inboxes and output are named by session (see PermsNode)
			}
			if (strings.Contains(s, "*") || strings.HasSuffix(s, ">")) && !strings.Contains(s, "n1") {
				t.Errorf("node permission %q reaches beyond node n1", s)
			}
		}
	}
	for _, s := range PermsProducer("acme", "default").Publish {
		if strings.HasPrefix(s, "wf.node.") || strings.HasPrefix(s, "$KV.") || strings.Contains(s, "CONSUMER") {
			t.Errorf("producer permission %q", s)
		}
	}
}
