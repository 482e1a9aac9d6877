package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_CLITenantRefusals: the real `warmfleet` binary logged in
// as a producer (through the auth callout, over TLS) submits in its own
// tenant; told another tenant, its submit and cancel are refused by the
// server's permissions and the CLI says to set --tenant or
// WARMFLEET_TENANT to the login's tenant. Nothing lands in the other
// tenant, and the producer's Run is untouched.
func TestAcceptance_CLITenantRefusals(t *testing.T) {
	sf := newSecureFleet(t)
	cli := warmfleetCLI{t: t, bin: testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet"), url: sf.url}
	tokenFile := filepath.Join(t.TempDir(), "producer.token")
	if err := os.WriteFile(tokenFile, []byte(sf.producerToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := sf.pki.Client()
	for k, v := range map[string]string{bus.EnvNATSTokenFile: tokenFile, bus.EnvNATSInboxName: sf.producerName, bus.EnvNATSCAFile: files.CAFile,
		bus.EnvNATSCertFile: files.CertFile, bus.EnvNATSKeyFile: files.KeyFile, bus.EnvNATSUser: "", "WARMFLEET_NATS_TOKEN": "", "WARMFLEET_TENANT": ""} {
		t.Setenv(k, v)
	}

	out, errs, code := cli.run(time.Minute, "--tenant", sf.producerName, "run", "submit", "--image", testImage, "--request-id", "cli-1", "--", "true")
	own := sf.producerRun("cli-1")
	if code != 0 || !strings.Contains(out, "as run "+own) {
		t.Fatalf("submit in its own tenant: exit %d\n%s\n%s", code, out, errs)
	}
	sf.eventually(30*time.Second, "the producer's Run stored", func() bool { return sf.runExists(own) })

	for _, args := range [][]string{
		{"--tenant", schemas.DefaultTenant, "run", "submit", "--image", testImage, "--request-id", "cli-2", "--", "true"},
		{"--tenant", schemas.DefaultTenant, "run", "cancel", own},
	} {
		start := time.Now()
		out, errs, code := cli.run(time.Minute, args...)
		if code == 0 || !strings.Contains(errs, "--tenant") || !strings.Contains(errs, "WARMFLEET_TENANT") || !strings.Contains(errs, `"`+schemas.DefaultTenant+`"`) {
			t.Errorf("warmfleet %s as producer %s: exit %d, want a refusal saying to set --tenant\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), sf.producerName, code, out, errs)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("warmfleet %s: the refusal took %s", strings.Join(args, " "), d)
		}
	}
	if sf.runExists(schemas.RunIDFor(schemas.DefaultTenant, "cli-2")) {
		t.Fatal("a Run was stored in the default tenant")
	}
	s, err := sf.conn.JS.Stream(context.Background(), bus.RunsStream(schemas.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(context.Background()); err != nil || info.State.Msgs != 0 || info.State.LastSeq != 0 {
		t.Fatalf("the default tenant's intake stream took %+v (%v)", info.State, err)
	}
}

// runExists reports whether wf_runs holds runID.
func (sf *secureFleet) runExists(runID string) bool {
	kv, err := sf.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		sf.t.Fatal(err)
	}
	_, err = kv.Get(context.Background(), runID)
	return err == nil
}
