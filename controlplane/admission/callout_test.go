package admission

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/randid"
	"github.com/warmfleet/warmfleet/schemas"
)

// newToken mints a token as enrollment does.
func newToken() string { return randid.Token(32) }

// securedBus is an embedded nats-server with auth callout on, provisioned,
// with the real callout serving it.
type securedBus struct {
	url     string
	cp      *bus.Conn // the control plane's own login
	callout *Callout
}

// login connects as user with secret once and hangs up: nil is admitted.
func (sb *securedBus) login(user, secret string) error {
	nc, err := nats.Connect(sb.url, nats.UserInfo(user, secret), nats.NoReconnect(), nats.RetryOnFailedConnect(false))
	if err == nil {
		nc.Close()
	}
	return err
}

func startSecuredBus(t *testing.T) *securedBus { return startSecuredBusWith(t, Config{}) }

// startSecuredBusWith serves cfg (its issuer seed made here).
func startSecuredBusWith(t *testing.T, cfg Config) *securedBus {
	t.Helper()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := issuer.Seed()
	pub, _ := issuer.PublicKey()
	password := newToken()
	srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: t.TempDir(), Port: -1,
		Auth: &bus.EmbeddedAuth{ServiceUser: "warmfleet-cp", ServicePassword: password, Issuer: pub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	log := zaptest.NewLogger(t)
	cp, err := bus.Connect(srv.URL(), "warmfleet-cp", log, nats.UserInfo("warmfleet-cp", password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cp.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, cp.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	cfg.IssuerSeed = seed
	a, err := New(ctx, cp, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Serve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	for srv.Server().GlobalAccount().Interest(bus.AuthCalloutSubject) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the auth callout did not subscribe in 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &securedBus{url: srv.URL(), cp: cp, callout: a}
}

// New refuses a configuration that would admit logins it should not, and
// its errors never echo a token.
func TestNew_RefusesConfig(t *testing.T) {
	account, _ := nkeys.CreateAccount()
	accountSeed, _ := account.Seed()
	user, _ := nkeys.CreateUser()
	userSeed, _ := user.Seed()
	const secret = "Zq9-planted-secret-token"
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"not a seed", Config{IssuerSeed: []byte("SAnot")}, "issuer seed"},
		{"a user seed", Config{IssuerSeed: userSeed}, "account nkey seed"},
		{"a producer named operator", Config{IssuerSeed: accountSeed, Producers: map[string]Producer{"operator": {Token: secret}}}, "producer name"},
		{"a producer name with a dot", Config{IssuerSeed: accountSeed, Producers: map[string]Producer{"a.b": {Token: secret}}}, "producer name"},
		{"a short producer token", Config{IssuerSeed: accountSeed, Producers: map[string]Producer{"acme": {Token: "short"}}}, "shorter than 16"},
		{"a producer of a bad tenant", Config{IssuerSeed: accountSeed, Producers: map[string]Producer{"acme": {Token: secret, Tenant: "A.b"}}}, "invalid_tenant"},
		{"a short operator token", Config{IssuerSeed: accountSeed, OperatorToken: "short"}, "shorter than 16"},
	} {
		_, err := New(context.Background(), nil, c.cfg, zaptest.NewLogger(t))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error echoes the token: %v", c.name, err)
		}
	}
}

// The operator's and producers' logins are decided from the configured
// hashes alone: no bucket is read.
func TestAuthorize_OperatorAndProducers(t *testing.T) {
	opTok, acmeTok, betaTok := newToken(), newToken(), newToken()
	producers, operator, err := hashSecrets(map[string]Producer{"acme": {Token: acmeTok}, "beta": {Token: betaTok, Tenant: "team-b"}}, opTok)
	if err != nil {
		t.Fatal(err)
	}
	a := &Callout{producers: producers, operator: operator, now: time.Now}
	for _, c := range []struct {
		name, user, secret, kind string // kind "": refused
	}{
		{"the operator", bus.OperatorUser, opTok, "operator"},
		{"the operator token without a user", "", opTok, "operator"},
		{"the operator with a producer's token", bus.OperatorUser, acmeTok, ""},
		{"a producer", "acme", acmeTok, "producer"},
		{"a producer with the operator token", "acme", opTok, ""},
		{"a producer with a token in the password field's place", "acme", "", ""},
		{"an unknown user with a non-token secret", "nobody", "hunter2", ""},
	} {
		g, err := a.authorize(context.Background(), jwt.ConnectOptions{Username: c.user, Password: c.secret})
		var ref *Refusal
		switch {
		case c.kind == "" && !errors.As(err, &ref):
			t.Errorf("%s: %+v %v, want a refusal", c.name, g, err)
		case c.kind == "" && (strings.Contains(ref.Error(), opTok) || strings.Contains(ref.Error(), acmeTok)):
			t.Errorf("%s: the refusal echoes a token: %v", c.name, ref)
		case c.kind != "" && (err != nil || g.kind != c.kind):
			t.Errorf("%s: %+v %v, want a %s grant", c.name, g, err, c.kind)
		}
	}
	g, _ := a.authorize(context.Background(), jwt.ConnectOptions{Username: "acme", Token: acmeTok})
	if g.perms == nil || !slices.Equal(g.perms.Publish, bus.PermsProducer("acme", schemas.DefaultTenant).Publish) {
		t.Fatalf("a producer's grant (token in the token field) = %+v, want bus.PermsProducer", g)
	}
	// A producer listed with a tenant is granted that tenant's subjects.
	g, err = a.authorize(context.Background(), jwt.ConnectOptions{Username: "beta", Password: betaTok})
	if err != nil || g.perms == nil || !reflect.DeepEqual(*g.perms, bus.PermsProducer("beta", "team-b")) {
		t.Fatalf("producer beta of tenant team-b: %+v, %v; want bus.PermsProducer(beta, team-b)", g, err)
	}
	if _, err := a.authorize(context.Background(), jwt.ConnectOptions{Username: "beta", Password: acmeTok}); err == nil {
		t.Fatal("producer beta logged in with acme's token")
	}
}

// An agent on first boot logs in with its invitation, which stays for
// enrollment to redeem: only for its node, only before it expires.
func TestCallout_InvitationLogin(t *testing.T) {
	sb := startSecuredBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enrollKV, _ := sb.cp.JS.KeyValue(ctx, bus.BucketEnroll)
	invite := func(node string, expires time.Time) string {
		tok := newToken()
		inv := schemas.Invitation{NodeID: node, Generation: 1, CreatedAt: time.Now(), ExpiresAt: expires}
		if _, err := bus.CreateJSON(ctx, enrollKV, schemas.InvitationKey(tok), &inv); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := invite("n1", time.Now().Add(time.Minute))
	for range 2 {
		if err := sb.login("n1", good); err != nil {
			t.Fatalf("an invitation's login: %v", err)
		}
	}
	if _, err := enrollKV.Get(ctx, schemas.InvitationKey(good)); err != nil {
		t.Fatalf("the login redeemed the invitation: %v", err)
	}
	for _, c := range []struct{ name, user, secret string }{
		{"another node's invitation", "n2", good},
		{"an expired invitation", "n1", invite("n1", time.Now().Add(-time.Second))},
		{"no invitation", "n1", newToken()},
		{"a node id that is no subject token", "n.1", invite("n.1", time.Now().Add(time.Minute))},
		{"no secret", "n1", ""},
	} {
		if err := sb.login(c.user, c.secret); !bus.IsAuthError(err) {
			t.Errorf("%s: %v, want refused", c.name, err)
		}
	}
}
