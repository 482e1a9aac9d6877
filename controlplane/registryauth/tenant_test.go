package registryauth_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	fleetPassword = "Fleet-Secret-5eed"
	teamAPassword = "TeamA-Secret-a11ce"
)

// tenantSource is a fleet credential for registry.example.com and team-a's
// own for it and for only-a.example.com, read as serve reads them.
func tenantSource(t *testing.T) *registryauth.Source {
	t.Helper()
	fleet, err := registryauth.ParseConfig([]byte(`{"auths": {"registry.example.com": {"username": "fleet", "password": "` + fleetPassword + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	src, err := registryauth.NewSource(fleet, nil, registryauth.HelperRunner{})
	if err != nil {
		t.Fatal(err)
	}
	own, err := registryauth.ParseConfig([]byte(`{"auths": {"registry.example.com": {"username": "team-a", "password": "` + teamAPassword + `"},
		"only-a.example.com": {"username": "team-a", "password": "` + teamAPassword + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.AddTenant("team-a", own); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestSourceTenants: a tenant's own credential comes first for it and
// never for another tenant, who gets the fleet's or none; a tenant name is
// checked, and given once.
func TestSourceTenants(t *testing.T) {
	ctx := context.Background()
	src := tenantSource(t)
	for _, c := range []struct {
		tenant   registryauth.Tenant
		registry string
		user     string
	}{
		{"team-a", "registry.example.com", "team-a"},
		{"team-a", "public.example.com", ""},
		{"team-b", "registry.example.com", "fleet"},
		{"team-b", "only-a.example.com", ""},
		{schemas.DefaultTenant, "registry.example.com", "fleet"},
		{registryauth.NoTenant, "only-a.example.com", ""},
	} {
		got, err := src.Lookup(ctx, c.tenant, c.registry)
		if err != nil || got.Username != c.user || got.Anonymous != (c.user == "") || (c.tenant != "team-a" && got.Secret == teamAPassword) {
			t.Errorf("tenant %q, %s: %+v, %v; want user %q", c.tenant, c.registry, got, err, c.user)
		}
	}
	if err := src.AddTenant("team-a", &registryauth.DockerConfig{}); err == nil {
		t.Error("a tenant's credentials given twice were taken")
	}
	if err := src.AddTenant("Team_B", &registryauth.DockerConfig{}); !errorsIsCode(err, schemas.CodeInvalidTenant) {
		t.Errorf("a malformed tenant: %v, want %s", err, schemas.CodeInvalidTenant)
	}
	withHelper, err := registryauth.ParseConfig([]byte(`{"credHelpers": {"ecr.example.com": "ecr-login"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.AddTenant("team-c", withHelper); err != nil {
		t.Fatal(err)
	}
	if h := src.Helpers(); len(h) != 1 || h[0] != "ecr-login" {
		t.Errorf("helpers %v: a tenant's helper is checked at start too", h)
	}
	if ts := src.Tenants(); strings.Join(ts, ",") != "team-a,team-c" {
		t.Errorf("tenants %v", ts)
	}
	if err := src.CheckTenants([]string{schemas.DefaultTenant, "team-a", "team-c"}); err != nil {
		t.Errorf("configured tenants: %v", err)
	}
	for _, c := range []struct {
		configured []string
		unknown    string
	}{{nil, "team-a"}, {[]string{schemas.DefaultTenant, "team-a"}, "team-c"}} {
		if err := src.CheckTenants(c.configured); !errorsIsCode(err, schemas.CodeTenantUnknown) || !strings.Contains(err.Error(), `"`+c.unknown+`"`) {
			t.Errorf("tenants %v: %v, want %s naming %s", c.configured, err, schemas.CodeTenantUnknown, c.unknown)
		}
	}
	var none *registryauth.Source
	if err := none.CheckTenants(nil); err != nil {
		t.Errorf("no source: %v", err)
	}
}

func errorsIsCode(err error, code schemas.Code) bool {
	r := schemas.AsRefusal(err)
	return err != nil && r.Code == code
}

// TestServiceTenantCredentials asks over NATS as nodes do: a node pulling
// for a booked Run gets that Run's tenant's credential; tenant team-a's is
// never given for another tenant's Run of the same registry (team-b gets
// the fleet's, or anonymous where only team-a holds one), on a warm
// replica or a cold one reading wf_runs; a pull wanted by several
// tenants' prefetches gets the fleet's only. No log line holds a secret.
func TestServiceTenantCredentials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	conn := testenv.ProvisionedBus(t, "cp")
	var buckets []jetstream.KeyValue
	for _, b := range []string{bus.BucketNodes, bus.BucketRuns, bus.BucketResidency} {
		h, err := conn.JS.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		buckets = append(buckets, h)
	}
	nodes, runsBucket, residency := buckets[0], buckets[1], buckets[2]
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := bus.CreateJSON(ctx, nodes, n, schemas.NodeRecord{NodeID: n, FencingToken: 4, State: schemas.NodeReady, LeaseExpires: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	app := "registry.example.com/shared/app@" + digestA
	onlyA := "only-a.example.com/app@" + digestA
	warm := "registry.example.com/shared/warm@" + digestB
	for _, r := range []schemas.Run{
		{ID: "run-a", Tenant: "team-a", Phase: schemas.PhaseRunning, NodeID: "node-a", Request: schemas.RunRequest{Image: app}},
		{ID: "run-b", Tenant: "team-b", Phase: schemas.PhasePreparing, NodeID: "node-b", Request: schemas.RunRequest{Image: app}},
		{ID: "run-b2", Tenant: "team-b", Phase: schemas.PhasePreparing, NodeID: "node-b", Request: schemas.RunRequest{Image: onlyA}},
		{ID: "run-d", Phase: schemas.PhasePlaced, Queued: true, NodeID: "node-a", Request: schemas.RunRequest{Image: onlyA}},
	} {
		if _, err := bus.CreateJSON(ctx, runsBucket, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	c := cache.New()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	if err := c.Start(ctx, &wg, runsBucket, nodes, residency, log); err != nil {
		t.Fatal(err)
	}
	src := tenantSource(t)
	// Prefetches of warm: team-a's alone on node-a, team-a's and team-b's on node-b.
	prefetch := func(nodeID string, ref schemas.ImageRef) []string {
		switch {
		case ref.String() != warm:
			return nil
		case nodeID == "node-a":
			return []string{"team-a"}
		}
		return []string{"team-b", "team-a"}
	}
	svc := registryauth.NewService(conn, c, nodes, runsBucket, src, []registryauth.ImageWanted{registryauth.BookedImages(c), prefetch}, nodecreds.Limit{}, time.Now, log)
	stop, err := svc.Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	agentConn := testenv.Dial(t, conn.NC.ConnectedUrl(), "node")
	ask := func(node, ref, runID string) schemas.Reply[schemas.RegistryCredential] {
		t.Helper()
		b, err := codec.Encode(codec.MsgPack, schemas.RegistryCredentialRequest{NodeID: node, FencingToken: 4, Reference: ref, RunID: runID})
		if err != nil {
			t.Fatal(err)
		}
		m, err := agentConn.NC.Request(bus.NodeRegistryCredentials(node), b, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep schemas.Reply[schemas.RegistryCredential]
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	// The cache catches up with the records written above.
	deadline := time.Now().Add(10 * time.Second)
	for rep := ask("node-b", app, ""); rep.OK == nil; rep = ask("node-b", app, "") {
		if time.Now().After(deadline) {
			t.Fatalf("node-b's booked image: %+v", rep.Refusal)
		}
		time.Sleep(50 * time.Millisecond)
	}

	check := func(name string, rep schemas.Reply[schemas.RegistryCredential], user string) {
		t.Helper()
		switch ok := rep.OK; {
		case ok == nil:
			t.Errorf("%s: refused %+v, want user %q", name, rep.Refusal, user)
		case user == "" && (!ok.Anonymous || ok.Secret != ""):
			t.Errorf("%s: %s, want anonymous", name, ok)
		case user != "" && (ok.Username != user || ok.Anonymous):
			t.Errorf("%s: user %q, want %q", name, ok.Username, user)
		case user != "team-a" && ok.Secret == teamAPassword:
			t.Errorf("%s: team-a's secret given", name)
		}
	}
	check("team-a's Run", ask("node-a", app, "run-a"), "team-a")
	check("team-b's Run of the same registry", ask("node-b", app, "run-b"), "fleet")
	check("team-b's Run, named by no Run id", ask("node-b", app, ""), "fleet")
	check("team-b's Run of a registry only team-a holds", ask("node-b", onlyA, "run-b2"), "")
	check("the default tenant's Run of a registry only team-a holds", ask("node-a", onlyA, "run-d"), "")
	check("team-a's prefetch", ask("node-a", warm, ""), "team-a")
	check("team-a's and team-b's prefetches", ask("node-b", warm, ""), "fleet")
	// node-b holds no booking of run-a, but team-b's booking of app: team-b's reason.
	check("team-a's Run id named on team-b's node", ask("node-b", app, "run-a"), "fleet")

	// A replica whose cache has seen nothing reads the named Run.
	cold := registryauth.NewService(conn, cache.New(), nodes, runsBucket, src, nil, nodecreds.Limit{}, time.Now, log)
	check("cold replica, team-a's Run", cold.Answer(ctx, bus.NodeRegistryCredentials("node-a"), schemas.RegistryCredentialRequest{NodeID: "node-a", FencingToken: 4, Reference: app, RunID: "run-a"}), "team-a")
	check("cold replica, team-b's Run", cold.Answer(ctx, bus.NodeRegistryCredentials("node-b"), schemas.RegistryCredentialRequest{NodeID: "node-b", FencingToken: 4, Reference: app, RunID: "run-b"}), "fleet")
	if rep := cold.Answer(ctx, bus.NodeRegistryCredentials("node-b"), schemas.RegistryCredentialRequest{NodeID: "node-b", FencingToken: 4, Reference: app, RunID: "run-a"}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeImageNotWanted {
		t.Errorf("cold replica, team-a's Run named from node-b: %+v %+v, want %s", rep.OK, rep.Refusal, schemas.CodeImageNotWanted)
	}
	for _, e := range logs.All() {
		if text := e.Message + fieldsText(e); strings.Contains(text, teamAPassword) || strings.Contains(text, fleetPassword) {
			t.Fatalf("a log line holds a password: %s %v", e.Message, e.ContextMap())
		}
	}
}
