package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// registryAuthFile writes a Docker config.json giving each registry host
// its user and password (in the "auth" form docker login writes) and
// returns the control plane's source read from it, as `warmfleet serve
// --registry-auth` reads it, with helpers as --registry-credential-helper
// gives them.
func registryAuthFile(t *testing.T, creds map[string][2]string, helpers map[string]string) *registryauth.Source {
	t.Helper()
	var entries []string
	for host, c := range creds {
		entries = append(entries, fmt.Sprintf("%q: {%q: %q}", host, "auth", base64.StdEncoding.EncodeToString([]byte(c[0]+":"+c[1]))))
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`{"auths": {`+strings.Join(entries, ", ")+`}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	file, err := registryauth.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	src, err := registryauth.NewSource(file, helpers, registryauth.HelperRunner{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// pushPrivate builds an image outside the world's image dir (so a registry
// is its only source) and pushes it to reg.
func pushPrivate(t *testing.T, reg *testenv.Registry, name string) string {
	t.Helper()
	img := testenv.BuildBusyboxImage(t, t.TempDir(), name, testenv.WithFile("/etc/variant", name))
	return reg.Push(t, "team/"+name, img)
}

// authFailure checks a Run failed, on its first and only attempt, with
// registry_auth_failed, and that its failure event names the registry and
// what to do.
func (f *fleet) authFailure(id, host string) {
	f.t.Helper()
	r := f.waitPhase(id, schemas.PhaseFailed, 90*time.Second)
	if r.Reason != string(schemas.CodeRegistryAuthFailed) || r.Attempt != 1 {
		f.t.Fatalf("run %s: failed with %q after %d attempts, want %s on the first", id, r.Reason, r.Attempt, schemas.CodeRegistryAuthFailed)
	}
	for _, ev := range f.events(id) {
		if ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseFailed {
			if ev.Code != schemas.CodeRegistryAuthFailed || !strings.Contains(ev.Message, "registry "+host) || !strings.Contains(ev.Message, "--registry-auth") {
				f.t.Fatalf("run %s: failure event %q %q, want %s naming registry %s and --registry-auth", id, ev.Code, ev.Message, schemas.CodeRegistryAuthFailed, host)
			}
			return
		}
	}
	f.t.Fatalf("run %s: no failure event", id)
}

// TestAcceptance_PrivateRegistryPull: four registries that demand a
// login. The control plane holds the right credential for the first, a
// wrong one for the second, none for the third, and for the fourth a
// credential helper that hangs. A Run from the first pulls and succeeds;
// Runs from the others fail, once, with registry_auth_failed naming their
// registry and what to do; the hung helper is timed out and what it
// printed is nowhere in the Run's events.
func TestAcceptance_PrivateRegistryPull(t *testing.T) {
	w := newWorld(t)
	good, wrong, none, hung := testenv.StartRegistry(t), testenv.StartRegistry(t), testenv.StartRegistry(t), testenv.StartRegistry(t)
	helperDir := t.TempDir()
	helperSays := "helper-output-" + randomSecret(t)
	if err := os.WriteFile(filepath.Join(helperDir, registryauth.HelperBinary("hangs")), []byte("#!/bin/sh\necho "+helperSays+"\nsleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", helperDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	src := registryAuthFile(t, map[string][2]string{
		good.Host:  {good.User, good.Password},
		wrong.Host: {wrong.User, "not-" + wrong.Password},
	}, map[string]string{hung.Host: "hangs"})
	f := newFleet(t, func(c *controlplane.Config) { c.RegistryAuth = src })
	f.startAgent(agentSpec{id: "node-a", world: w})

	okID := f.submit(schemas.RunRequest{RequestID: "private-ok", Image: pushPrivate(t, good, "ok"), Command: []string{"grep", "-qx", "ok", "/etc/variant"}})
	wrongID := f.submit(schemas.RunRequest{RequestID: "private-wrong", Image: pushPrivate(t, wrong, "wrong"), Command: []string{"true"}})
	noneID := f.submit(schemas.RunRequest{RequestID: "private-none", Image: pushPrivate(t, none, "none"), Command: []string{"true"}})
	hungID := f.submit(schemas.RunRequest{RequestID: "private-hung", Image: pushPrivate(t, hung, "hung"), Command: []string{"true"}})

	r := f.waitPhase(okID, schemas.PhaseSucceeded, 90*time.Second)
	if r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("private run: exit %v", r.ExitCode)
	}
	f.authFailure(wrongID, wrong.Host)
	f.authFailure(noneID, none.Host)
	f.authFailure(hungID, hung.Host)
	timedOut := false
	for _, ev := range f.events(hungID) {
		if strings.Contains(ev.Message, helperSays) {
			t.Fatalf("an event holds the helper's output: %q", ev.Message)
		}
		timedOut = timedOut || (ev.Code == schemas.CodeRegistryAuthFailed && strings.Contains(ev.Message, "docker-credential-hangs gave no answer"))
	}
	if !timedOut {
		t.Fatalf("the failure of %s does not say its helper timed out: %+v", hungID, f.events(hungID))
	}
}

// startContainerdAgent starts an agent that logs in with NATS auth (as
// `warmfleet-agent --nats-auth` does) and runs its workloads in w's
// containerd: its credential asks go through its node permissions.
func (sf *secureFleet) startContainerdAgent(id string, w world) *secureAgent {
	sf.t.Helper()
	boot := sf.invite(id, 1, time.Minute)
	sf.plant("invitation of "+id, boot.EnrollmentToken)
	dataDir := tempDir(sf.t)
	creds := bus.AgentCredentials(id, boot.EnrollmentToken, boot.EnrollmentToken)
	log := sf.log.Named(id)
	ctx, cancel := context.WithCancel(context.Background())
	rt, err := containerd.New(ctx, w.runtimeOptions(dataDir, log))
	if err != nil {
		sf.t.Fatal(err)
	}
	conn, err := bus.Connect(sf.url, "warmfleet-agent-"+id, log, append(append([]nats.Option{}, sf.tls...), creds.Options()...)...)
	if err != nil {
		sf.t.Fatal(err)
	}
	a, err := agent.New(agent.Config{NodeID: id, Generation: 1, EnrollmentToken: boot.EnrollmentToken, DataDir: dataDir, StopGrace: time.Second,
		Credentials: creds, LogDialer: bus.RunLogDialer(sf.url, id, sf.tls, creds, log)}, conn, rt, log)
	if err != nil {
		sf.t.Fatal(err)
	}
	p := newPart(cancel, func() error {
		defer func() { conn.Close(); _ = rt.Close() }()
		return a.Run(ctx)
	})
	sf.t.Cleanup(func() { p.stop(sf.t) })
	sf.waitNode(id, a)
	sf.plant("session of "+id, a.Enrollment().SessionToken)
	return &secureAgent{id: id, agent: a, conn: conn, part: p, dataDir: dataDir}
}

// TestAcceptance_CredentialsNeverAtRest plants registry passwords (a right
// one and a wrong one, and their base64 forms: the config file's "auth"
// and HTTP basic auth's) with NATS auth and TLS on, runs Runs that pull
// with them (and one the registry refuses), and then finds them in no KV
// value or history, no stream message (stored or published), no file
// under the agent's data dir (journal included) and no log line of the
// control plane, the agent, its containerd client or nats-server, all
// at debug level.
func TestAcceptance_CredentialsNeverAtRest(t *testing.T) {
	w := newWorld(t)
	reg, other := testenv.StartRegistry(t), testenv.StartRegistry(t)
	wrongPassword := "wrong-" + randomSecret(t)
	src := registryAuthFile(t, map[string][2]string{reg.Host: {reg.User, reg.Password}, other.Host: {other.User, wrongPassword}}, nil)
	sf := newSecureFleet(t, func(c *controlplane.Config) { c.RegistryAuth = src })
	for name, secret := range map[string]string{"registry password": reg.Password, "wrong registry password": wrongPassword} {
		sf.plant(name, secret)
		user := reg.User
		if secret == wrongPassword {
			user = other.User
		}
		// "auth" in a config.json and the Authorization header: base64 of
		// user:password; and the password alone, encoded either way.
		sf.plant(name+" (base64 user:password)", base64.StdEncoding.EncodeToString([]byte(user+":"+secret)))
		sf.plant(name+" (base64)", base64.StdEncoding.EncodeToString([]byte(secret)))
		sf.plant(name+" (base64url)", base64.RawURLEncoding.EncodeToString([]byte(secret)))
	}
	tap := sf.tapStreams()
	ctx := context.Background()

	a := sf.startContainerdAgent("node-a", w)
	_, pjs, _ := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	submit := func(id, image string) string {
		body := fmt.Sprintf(`{"request_id":%q,"image":%q,"command":["true"]}`, id, image)
		if _, err := pjs.Publish(ctx, sf.producerSubmit(), []byte(body), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
		return sf.producerRun(id)
	}
	first := pushPrivate(t, reg, "first")
	sf.waitPhase(submit("pull-1", first), schemas.PhaseSucceeded, 90*time.Second)
	sf.waitPhase(submit("pull-2", pushPrivate(t, reg, "second")), schemas.PhaseSucceeded, 90*time.Second)
	sf.waitPhase(submit("pull-again", first), schemas.PhaseSucceeded, 90*time.Second) // present: no ask
	sf.authFailure(submit("pull-refused", pushPrivate(t, other, "refused")), other.Host)

	// The agent asked within its permissions: nats-server saw no violation.
	for _, e := range sf.logs.All() {
		if strings.Contains(strings.ToLower(e.Message), "violation") && !strings.Contains(e.Message, "Authorization Violation") {
			t.Errorf("nats-server: %s", e.Message)
		}
	}

	// Canaries prove each search finds what it looks for: one in a log
	// line, one in a file under the agent's data dir.
	logCanary, fileCanary := randomSecret(t), randomSecret(t)
	sf.plant("log canary", logCanary)
	sf.plant("file canary", fileCanary)
	sf.log.Debug("canary", zap.String("value", logCanary))
	if err := os.WriteFile(filepath.Join(a.dataDir, "canary"), []byte("x"+fileCanary+"x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent keeps its own NATS session in its data dir (docs/security.md);
	// the files are searched for the registry's secrets.
	registrySecrets := map[string]string{}
	for name, secret := range sf.secrets {
		if strings.Contains(name, "registry") || name == "file canary" {
			registrySecrets[name] = secret
		}
	}
	hits := append(sf.searchAtRest(tap), searchFiles(t, a.dataDir, registrySecrets)...)
	canaries := map[string]bool{}
	for _, h := range hits {
		if c, ok := strings.CutPrefix(h[strings.LastIndex(h, " the ")+1:], "the "); ok && strings.HasSuffix(c, "canary") {
			canaries[c] = true
			continue
		}
		t.Error(h)
	}
	if len(canaries) != 2 {
		t.Fatalf("the searches found %d of the 2 canaries: %v", len(canaries), hits)
	}
	// The journal searched is the one that recorded these pulls.
	if j, err := os.ReadFile(filepath.Join(a.dataDir, "operations.jsonl")); err != nil || !strings.Contains(string(j), string(schemas.CodeRegistryAuthFailed)) {
		t.Fatalf("the agent's journal does not record the refused pull (%v)", err)
	}
}

// searchFiles returns one line per secret found in a file under dir (the
// agent's journal, logs and output).
func searchFiles(t *testing.T, dir string, secrets map[string]string) []string {
	t.Helper()
	var hits []string
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		for name, secret := range secrets {
			if strings.Contains(string(b), secret) {
				hits = append(hits, fmt.Sprintf("file %s holds the %s", path, name))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 {
		t.Fatalf("found %d files under %s; the search is not looking where it should", files, dir)
	}
	t.Logf("searched %d files under the agent's data dir for %d secrets", files, len(secrets))
	return hits
}

// TestAcceptance_TenantRegistryCredentials: tenants' own registry
// credentials against real registries. The fleet's file holds a wrong
// password for the first registry and the default tenant's own file the
// right one: the default tenant's Run pulls with its own. Only tenant
// team-a holds a credential for the second: the default tenant's Run from
// it is never given team-a's and fails registry_auth_failed, once.
func TestAcceptance_TenantRegistryCredentials(t *testing.T) {
	w := newWorld(t)
	own, teamAOnly := testenv.StartRegistry(t), testenv.StartRegistry(t)
	src := registryAuthFile(t, map[string][2]string{own.Host: {own.User, "not-" + own.Password}}, nil)
	for tenant, creds := range map[string]map[string][2]string{
		schemas.DefaultTenant: {own.Host: {own.User, own.Password}},
		"team-a":              {teamAOnly.Host: {teamAOnly.User, teamAOnly.Password}},
	} {
		file, err := registryauth.LoadConfig(tenantAuthFile(t, creds))
		if err != nil {
			t.Fatal(err)
		}
		if err := src.AddTenant(registryauth.Tenant(tenant), file); err != nil {
			t.Fatal(err)
		}
	}
	f := newFleet(t, func(c *controlplane.Config) {
		c.RegistryAuth = src
		c.Tenants = []string{schemas.DefaultTenant, "team-a"}
	})
	f.startAgent(agentSpec{id: "node-a", world: w})

	okID := f.submit(schemas.RunRequest{RequestID: "tenant-own", Image: pushPrivate(t, own, "own"), Command: []string{"grep", "-qx", "own", "/etc/variant"}})
	foreignID := f.submit(schemas.RunRequest{RequestID: "tenant-foreign", Image: pushPrivate(t, teamAOnly, "foreign"), Command: []string{"true"}})
	if r := f.waitPhase(okID, schemas.PhaseSucceeded, 90*time.Second); r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("the default tenant's Run with its own credential: exit %v", r.ExitCode)
	}
	f.authFailure(foreignID, teamAOnly.Host)
}

// tenantAuthFile writes a Docker config.json as registryAuthFile does and
// returns its path, for `serve --tenant-registry-auth T=PATH`.
func tenantAuthFile(t *testing.T, creds map[string][2]string) string {
	t.Helper()
	var entries []string
	for host, c := range creds {
		entries = append(entries, fmt.Sprintf("%q: {%q: %q, %q: %q}", host, "username", c[0], "password", c[1]))
	}
	path := filepath.Join(t.TempDir(), "tenant-config.json")
	if err := os.WriteFile(path, []byte(`{"auths": {`+strings.Join(entries, ", ")+`}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAcceptance_TenantPrefetchCredentials: a prefetch pulls with its
// tenant's registry credentials. Only team-a holds a credential for the
// registry: team-a's prefetch of an image there ends ready, the default
// tenant's prefetch of another image there is never given team-a's and
// ends failed.
func TestAcceptance_TenantPrefetchCredentials(t *testing.T) {
	w := newWorld(t)
	reg := testenv.StartRegistry(t)
	src := registryAuthFile(t, nil, nil)
	file, err := registryauth.LoadConfig(tenantAuthFile(t, map[string][2]string{reg.Host: {reg.User, reg.Password}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.AddTenant("team-a", file); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, func(c *controlplane.Config) {
		c.RegistryAuth = src
		c.Tenants = []string{schemas.DefaultTenant, "team-a"}
	})
	f.startAgent(agentSpec{id: "node-a", world: w})
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketPrefetch)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(req schemas.PrefetchRequest) schemas.PrefetchNode {
		t.Helper()
		rep := askJSON[schemas.Reply[schemas.Prefetch]](t, f.conn.NC, bus.SubjectPrefetch, req)
		if rep.OK == nil {
			t.Fatalf("prefetch %s: %+v", req.RequestID, rep.Refusal)
		}
		p := *rep.OK
		var n schemas.PrefetchNode
		f.eventually(90*time.Second, "prefetch "+req.RequestID+" to finish on node-a", func() bool {
			var q schemas.Prefetch
			if _, err := bus.GetJSON(context.Background(), kv, p.ID, &q); err != nil || q.Node("node-a") == nil {
				return false
			}
			n = *q.Node("node-a")
			return n.State.Finished()
		})
		return n
	}
	if n := entry(schemas.PrefetchRequest{RequestID: "warm-team-a", Image: pushPrivate(t, reg, "team-a"), Nodes: "node-a", Tenant: "team-a"}); n.State != schemas.PrefetchReady {
		t.Fatalf("team-a's prefetch with its own credential ended %s: %s %s", n.State, n.Code, n.Reason)
	}
	if n := entry(schemas.PrefetchRequest{RequestID: "warm-default", Image: pushPrivate(t, reg, "other"), Nodes: "node-a"}); n.State != schemas.PrefetchFailed {
		t.Fatalf("the default tenant's prefetch from team-a's registry ended %s: %s %s, want failed", n.State, n.Code, n.Reason)
	}
}
