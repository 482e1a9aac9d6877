package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// aOutput is what tenant a's Run writes: it must reach no one of tenant b.
const aOutput = "private-output-of-a"

// TestAcceptance_TenantIsolation: a secure fleet (auth and TLS) with two
// tenants, a and b, each with its own producer. A Run of a runs to success
// with output, which a reads back through its tenant's read services. Then
// b, logged in with its own credentials, tries to reach a's Run: with the
// real `nats` CLI (subscribing to a's events and output, asking a's read
// and secret services, reading wf_runs, WF_EVENTS and the artifact stores
// directly, publishing a's submit and cancel subjects) each attempt is
// refused by the server's permissions; with warmfleet's CLI as b, `run get`,
// `run events` and `run logs` of a's Run are refused run_not_found and
// `run cancel` is refused by intake; b's secret list shows none of a's
// secrets and a's is refused it; a's Run sees a's secret at launch and b's
// Run naming it is refused secret_unknown; a's private artifact mounts in a's Run and
// is artifact_unknown to b's. b submitting a's request id gets a Run
// of its own, and a submitting a request id b used first gets its own. a's
// Run is untouched throughout: its record's revision and its events are
// those it had when it ended.
func TestAcceptance_TenantIsolation(t *testing.T) {
	natsBin := findNatsCLI(t)
	w := newWorld(t)
	tokA, tokB := randomSecret(t), randomSecret(t)
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")
	keyFile := filepath.Join(t.TempDir(), "secrets.key")
	if out, err := exec.Command(bin, "secret", "new-key", "--key-file", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("secret new-key: %v\n%s", err, out)
	}
	sf := newSecureFleet(t, func(c *controlplane.Config) {
		c.Auth.Producers = map[string]admission.Producer{"a-prod": {Token: tokA, Tenant: "a"}, "b-prod": {Token: tokB, Tenant: "b"}}
		c.Tenants = []string{"a", "b", schemas.DefaultTenant}
		c.SecretsKeyFile = keyFile
	})
	sf.runtime = func(dataDir string, log *zap.Logger) noderuntime.Runtime {
		rt, err := containerd.New(context.Background(), w.runtimeOptions(dataDir, log))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Close() })
		return rt
	}
	sf.startAgent("local-1")
	a, b := sf.producerCLI(bin, "a-prod", tokA, "a"), sf.producerCLI(bin, "b-prod", tokB, "b")

	// a's Run, followed to its end and read back by a.
	submitArgs := func(requestID, text string) []string {
		return []string{"run", "submit", "--image", w.image.Reference, "--request-id", requestID, "--wait", "--", "sh", "-c", "echo " + text}
	}
	stdout, stderr, code := a.run(2*time.Minute, submitArgs("iso-1", aOutput)...)
	runA := schemas.RunIDFor("a", "iso-1")
	if code != 0 || stdout != aOutput+"\n" {
		t.Fatalf("a's run submit --wait: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	recA, revA := sf.tenantRun(runA)
	if recA.Tenant != "a" || recA.SubmittedBy != "a-prod" || recA.Phase != schemas.PhaseSucceeded {
		t.Fatalf("a's Run: tenant %q submitted by %q phase %s", recA.Tenant, recA.SubmittedBy, recA.Phase)
	}
	eventsA := sf.tenantEvents("a", runA)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "get", runA}, "succeeded"}, {[]string{"run", "logs", runA}, aOutput + "\n"},
		{[]string{"run", "events", runA}, "succeeded"}, {[]string{"run", "list"}, runA},
	} {
		out, errOut, code := a.run(time.Minute, c.args...)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Fatalf("a's warmfleet %s: exit %d, want %q in its output\n%s\n%s", strings.Join(c.args, " "), code, c.want, out, errOut)
		}
	}

	// b with the real nats CLI: each attempt refused by the permissions
	// the auth callout gave b's login.
	cli := newNatsCLI(t, natsBin, sf.nats.Server())
	cli.loginProducer(sf, "b-prod", tokB)
	if out := cli.run(30*time.Second, []string{"req", bus.TenantSubject("b", bus.TenantRunsList), "{}"}); !strings.Contains(out, `"runs"`) || strings.Contains(out, runA) {
		t.Fatalf("b lists its own Runs: want none of a's:\n%s", out)
	}
	get := fmt.Sprintf(`{"run_id":%q}`, runA)
	for _, c := range []struct {
		args     []string
		terminal bool
		subject  string // what the server's violation names
	}{
		{args: []string{"sub", "wf.events.a.>"}, subject: `"wf.events.a.>"`},
		{args: []string{"sub", "wf.logs.a.>"}, subject: `"wf.logs.a.>"`},
		{args: []string{"sub", bus.RunEventsSubject("a", runA)}, subject: `"` + bus.RunEventsSubject("a", runA) + `"`},
		{args: []string{"req", bus.TenantSubject("a", bus.TenantRunsGet), get}, subject: `"wf.tenant.a.runs.get"`},
		{args: []string{"req", bus.TenantSubject("a", bus.TenantRunsRead), `{"kind":"logs","run_id":"` + runA + `","max":10}`}, subject: `"wf.tenant.a.runs.read"`},
		{args: []string{"req", bus.TenantSubject("a", bus.TenantSecretLs), "{}"}, subject: `"wf.tenant.a.secret.list"`},
		{args: []string{"kv", "get", bus.BucketRuns, runA, "--raw"}, subject: "KV_" + bus.BucketRuns},
		{args: []string{"stream", "view", bus.StreamEvents, "--subject", bus.RunEventsSubject("a", runA)}, terminal: true, subject: bus.StreamEvents},
		{args: []string{"kv", "get", bus.BucketArtifacts, "x"}, subject: "KV_" + bus.BucketArtifacts},
		{args: []string{"obj", "get", bus.ObjectBucketArtifacts, "x"}, subject: "OBJ_" + bus.ObjectBucketArtifacts},
		{args: []string{"pub", bus.SubmitSubject("a", "b-prod"), `{"request_id":"iso-x","image":"` + w.image.Reference + `"}`}, subject: `"` + bus.SubmitSubject("a", "b-prod") + `"`},
		{args: []string{"pub", bus.CancelSubject("b", "a-prod"), get}, subject: `"` + bus.CancelSubject("b", "a-prod") + `"`},
		{args: []string{"pub", bus.CancelSubject("a", "a-prod"), get}, subject: `"` + bus.CancelSubject("a", "a-prod") + `"`},
	} {
		from := sf.logs.Len()
		out := cli.try(8*time.Second, c.args, c.terminal)
		if strings.Contains(out, aOutput) || strings.Contains(out, `"tenant":"a"`) || strings.Contains(out, `"request_id":"iso-1"`) {
			t.Fatalf("b's nats %s reached a's data:\n%s", shellJoin(c.args), out)
		}
		if !strings.Contains(strings.ToLower(out), "permissions violation") {
			t.Fatalf("b's nats %s: no permissions violation shown:\n%s", shellJoin(c.args), out)
		}
		sf.eventually(10*time.Second, "the server to refuse b's nats "+shellJoin(c.args), func() bool { return sf.violatedSince(from, c.subject) })
	}

	// b with warmfleet's CLI, in its own tenant: refused as if a's Run did
	// not exist.
	for _, args := range [][]string{{"run", "get", runA}, {"run", "events", runA}, {"run", "logs", runA}, {"run", "decision", runA}} {
		out, errOut, code := b.run(time.Minute, args...)
		if code == 0 || !strings.Contains(errOut, string(schemas.CodeRunNotFound)) || strings.Contains(out+errOut, aOutput) {
			t.Fatalf("b's warmfleet %s: exit %d, want refused run_not_found\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if out, errOut, code := b.run(time.Minute, "run", "list"); code != 0 || strings.Contains(out, runA) {
		t.Fatalf("b's run list: exit %d, shows a's Run:\n%s\n%s", code, out, errOut)
	}
	rejected := len(sf.tenantEvents("b", "rejected"))
	if out, errOut, code := b.run(time.Minute, "run", "cancel", runA); code != 0 {
		t.Fatalf("b's run cancel: exit %d\n%s\n%s", code, out, errOut)
	}
	sf.eventually(30*time.Second, "intake to refuse b's cancel of a's Run", func() bool {
		evs := sf.tenantEvents("b", "rejected")
		return len(evs) > rejected && evs[len(evs)-1].Code == schemas.CodeRunNotFound
	})
	// Outside its tenant b's CLI is refused by the permissions, saying to
	// set --tenant.
	if _, errOut, code := b.run(time.Minute, "--tenant", "a", "run", "cancel", runA); code == 0 || !strings.Contains(errOut, "--tenant") {
		t.Fatalf("b's run cancel --tenant a: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := b.run(time.Minute, "--tenant", "a", "run", "get", runA); code == 0 || !strings.Contains(errOut, "--tenant") {
		t.Fatalf("b's run get --tenant a: exit %d\n%s", code, errOut)
	}

	// Secrets: a's are a's alone. b's list shows none of them; a's
	// tenant's service refuses b's login (the nats CLI's request above too).
	secretFile, secretValue := filepath.Join(t.TempDir(), "value"), randomSecret(t)
	if err := os.WriteFile(secretFile, []byte(secretValue), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := a.run(time.Minute, "secret", "set", "a-token", "--from-file", secretFile); code != 0 {
		t.Fatalf("a's secret set: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := a.run(time.Minute, "secret", "list"); code != 0 || !strings.Contains(out, "a-token") {
		t.Fatalf("a's secret list: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := b.run(time.Minute, "secret", "list"); code != 0 || strings.Contains(out+errOut, "a-token") {
		t.Fatalf("b's secret list: exit %d, shows a's secret:\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := b.run(time.Minute, "--tenant", "a", "secret", "list"); code == 0 || strings.Contains(out+errOut, "a-token") {
		t.Fatalf("b's secret list --tenant a: exit %d\n%s\n%s", code, out, errOut)
	}

	// A Run of a's sees a's secret at launch; b's Run naming it is refused
	// at intake, as a secret b does not hold, naming the field.
	sum := sha256.Sum256([]byte(secretValue))
	useSecret := func(requestID string) []string {
		return []string{"run", "submit", "--image", w.image.Reference, "--request-id", requestID, "--secret-env", "TOKEN=a-token", "--wait", "--",
			"sh", "-c", `[ "$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)" = ` + hex.EncodeToString(sum[:]) + ` ] && echo secret-ok`}
	}
	if out, errOut, code := a.run(2*time.Minute, useSecret("secret-a")...); code != 0 || out != "secret-ok\n" {
		t.Fatalf("a's Run with its secret: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := b.run(2*time.Minute, useSecret("secret-b")...); code == 0 || !strings.Contains(errOut, string(schemas.CodeSecretUnknown)) ||
		!strings.Contains(errOut, "secret_env[0].secret") || strings.Contains(out, "secret-ok") {
		t.Fatalf("b's Run naming a's secret: exit %d, want refused secret_unknown naming secret_env[0].secret\n%s\n%s", code, out, errOut)
	}

	// Artifacts: a's private artifact mounts in a's Run, and is unknown to
	// b's, refused as a missing one is.
	weights := []byte("weights of tenant a\n")
	obs, err := sf.conn.JS.ObjectStore(context.Background(), bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	object := "sha256/" + strings.TrimPrefix(sha256Of(weights), "sha256:")
	if _, err := obs.PutBytes(context.Background(), object, weights); err != nil {
		t.Fatal(err)
	}
	sf.registerArtifact(schemas.ArtifactRecord{Name: "weights-a", Version: "v1", Digest: sha256Of(weights), SizeBytes: int64(len(weights)),
		Source: schemas.ArtifactSource{Object: object}, Tenant: "a"})
	mount := func(requestID string) []string {
		return []string{"run", "submit", "--image", w.image.Reference, "--request-id", requestID, "--artifact", "weights-a:v1=/m/w", "--wait", "--", "cat", "/m/w"}
	}
	if out, errOut, code := a.run(2*time.Minute, mount("art-a")...); code != 0 || out != string(weights) {
		t.Fatalf("a mounts its artifact: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := b.run(2*time.Minute, mount("art-b")...); code == 0 || !strings.Contains(errOut, string(schemas.CodeArtifactUnknown)) ||
		!strings.Contains(errOut, "artifacts[0]") || strings.Contains(out, string(weights)) {
		t.Fatalf("b mounts a's artifact: exit %d, want refused artifact_unknown naming artifacts[0]\n%s\n%s", code, out, errOut)
	}

	// Request ids are per tenant: b's iso-1 is a Run of b's, a's untouched.
	if out, errOut, code := b.run(2*time.Minute, submitArgs("iso-1", "b")...); code != 0 || out != "b\n" {
		t.Fatalf("b submits iso-1: exit %d\n%s\n%s", code, out, errOut)
	}
	if runB := schemas.RunIDFor("b", "iso-1"); runB == runA {
		t.Fatal("b's iso-1 names a's Run")
	} else if r, _ := sf.tenantRun(runB); r.Tenant != "b" || r.Phase != schemas.PhaseSucceeded {
		t.Fatalf("b's iso-1: tenant %q phase %s", r.Tenant, r.Phase)
	}
	// b uses iso-2 first; a's iso-2 is still a Run of a's own.
	for _, p := range []warmfleetCLI{b, a} {
		if out, errOut, code := p.run(2*time.Minute, submitArgs("iso-2", "two")...); code != 0 || out != "two\n" {
			t.Fatalf("submit iso-2: exit %d\n%s\n%s", code, out, errOut)
		}
	}
	if r, _ := sf.tenantRun(schemas.RunIDFor("a", "iso-2")); r.Tenant != "a" || r.SubmittedBy != "a-prod" {
		t.Fatalf("a's iso-2: tenant %q submitted by %q", r.Tenant, r.SubmittedBy)
	}

	// a's Run is as it ended.
	if r, rev := sf.tenantRun(runA); rev != revA || r.Phase != schemas.PhaseSucceeded {
		t.Fatalf("a's Run changed: revision %d (was %d), phase %s", rev, revA, r.Phase)
	}
	if evs := sf.tenantEvents("a", runA); len(evs) != len(eventsA) {
		t.Fatalf("a's Run has %d events, had %d when it ended: %+v", len(evs), len(eventsA), evs[len(eventsA):])
	}
}

// producerCLI is warmfleet's CLI logged in as producer name of tenant, as
// docs/security.md tells a producer to: a token file, the CA and client
// certificate, WARMFLEET_NATS_PRODUCER and WARMFLEET_TENANT.
func (sf *secureFleet) producerCLI(bin, name, token, tenant string) warmfleetCLI {
	file := filepath.Join(sf.t.TempDir(), name+".token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		sf.t.Fatal(err)
	}
	return warmfleetCLI{t: sf.t, bin: bin, url: sf.url, env: []string{
		bus.EnvNATSTokenFile + "=" + file, bus.EnvNATSInboxName + "=" + name, "WARMFLEET_TENANT=" + tenant,
		bus.EnvNATSCAFile + "=" + sf.pki.CAFile, bus.EnvNATSCertFile + "=" + sf.pki.ClientCert, bus.EnvNATSKeyFile + "=" + sf.pki.ClientKey,
	}}
}

// loginProducer makes the nats CLI log in as producer name, with the
// inbox prefix its permissions allow, through a context in NATS_CONTEXT.
func (c *natsCLI) loginProducer(sf *secureFleet, name, token string) {
	c.t.Helper()
	ctxFile := filepath.Join(c.t.TempDir(), name+".json")
	b, _ := json.Marshal(map[string]string{"url": sf.url, "user": name, "password": token, "ca": sf.pki.CAFile,
		"cert": sf.pki.ClientCert, "key": sf.pki.ClientKey, "inbox_prefix": bus.ProducerInboxPrefix(name)})
	if err := os.WriteFile(ctxFile, b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.env = append(c.env, "NATS_CONTEXT="+ctxFile)
}

// try runs one command for at most within (under a pseudo terminal when
// terminal), whatever its exit, and returns its output.
func (c *natsCLI) try(within time.Duration, args []string, terminal bool) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := c.command(ctx, c.argv(args, nil))
	if terminal {
		cmd = exec.CommandContext(ctx, "script", "-q", "-e", "-c", shellJoin(append([]string{c.bin}, c.argv(args, nil)...)), "/dev/null")
		cmd.Env, cmd.WaitDelay = c.env, 5*time.Second
	}
	out, err := cmd.CombinedOutput()
	c.record(args, fmt.Sprintf("%s(exit: %v)", out, err))
	return string(out)
}

// violatedSince reports whether the server logged a permissions violation
// naming subject after the first from log entries.
func (sf *secureFleet) violatedSince(from int, subject string) bool {
	all := sf.logs.All()
	for _, e := range all[min(from, len(all)):] {
		if strings.Contains(e.Message, "Violation") && strings.Contains(e.Message, subject) {
			return true
		}
	}
	return false
}

// tenantRun reads a Run record as the operator, with its revision.
func (sf *secureFleet) tenantRun(runID string) (schemas.Run, uint64) {
	sf.t.Helper()
	kv, err := sf.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		sf.t.Fatal(err)
	}
	var r schemas.Run
	rev, err := bus.GetJSON(context.Background(), kv, runID, &r)
	if err != nil {
		sf.t.Fatalf("run %s: %v", runID, err)
	}
	return r, rev
}

// tenantEvents reads, as the operator, what WF_EVENTS holds of tenant's
// Run runID (or of its rejections, runID "rejected").
func (sf *secureFleet) tenantEvents(tenant, runID string) []schemas.RunEvent {
	sf.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := runlog.StreamSource(sf.conn.JS, bus.StreamEvents, bus.RunEventsSubject(tenant, runID))
	last, _, err := src.Last(ctx)
	if err != nil || last == 0 {
		if err != nil {
			sf.t.Fatal(err)
		}
		return nil
	}
	cur, err := src.Open(ctx, 0, time.Time{})
	if err != nil {
		sf.t.Fatal(err)
	}
	defer cur.Stop()
	var out []schemas.RunEvent
	for {
		m, ok, err := cur.Next(ctx, 5*time.Second)
		if err != nil || !ok {
			sf.t.Fatalf("events of %s: %v (ok %v)", runID, err, ok)
		}
		var ev schemas.RunEvent
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &ev); err == nil {
			out = append(out, ev)
		}
		if m.Seq >= last {
			return out
		}
	}
}
