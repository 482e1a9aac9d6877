// Package admission is the NATS auth callout: nats-server asks it about
// every login but the control plane's own, and it turns a warmfleet secret
// into a NATS user with exactly that identity's permissions (bus.Perms*).
// Each identity it admits has its file: agents by invitation or session
// (node.go), an agent's log connection for one Run (runlogs.go), an
// agent's one-time artifact login (artifact.go), producers and the
// operator (producer.go).
package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// Config configures the auth callout: who may log in to NATS, and as
// what. Secrets are hashed when the callout is built and never kept or
// logged in the clear.
type Config struct {
	// IssuerSeed is the account nkey seed (SA...) that signs the users the
	// callout issues; nats-server is configured with its public key.
	IssuerSeed []byte
	// Producers maps a producer's name to its token and tenant.
	Producers map[string]Producer
	// OperatorToken logs in user "operator" with full permissions; empty
	// admits no operator (the control plane's own login still works).
	OperatorToken string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// grant is what one login is allowed, and until when.
type grant struct {
	kind    string // enrolling, node, node-logs, artifact, producer, operator
	name    string // node id, bus.NodeLogUser, bus.ArtifactUser, producer name, "operator"
	perms   *bus.Permissions
	expires time.Time // zero: no expiry
}

// Refusal is why a login was refused. Its message names what is wrong and
// what to do, and never the secret presented.
type Refusal struct {
	User   string
	Reason string
}

func (e *Refusal) Error() string {
	if e.User == "" {
		return "warmfleet: login refused: " + e.Reason
	}
	return fmt.Sprintf("warmfleet: login as %q refused: %s", e.User, e.Reason)
}

// Callout answers nats-server's authorization requests. It reads wf_enroll,
// wf_nodes, wf_rentals and wf_runs; an invitation is checked, not
// redeemed, at login (enrollment redeems it). Its one write: an artifact
// login's grant in wf_artifact_grants is deleted at its revision when it is
// used, so it admits one login.
type Callout struct {
	conn      *bus.Conn
	log       *zap.Logger
	kp        nkeys.KeyPair
	nodesKV   jetstream.KeyValue
	enrollKV  jetstream.KeyValue
	rentalsKV jetstream.KeyValue
	runsKV    jetstream.KeyValue
	grantsKV  jetstream.KeyValue
	producers map[string]producerLogin // name -> token hash, tenant
	operator  string                   // token hash
	now       func() time.Time
}

// New prepares the callout on conn, which must be the auth service's own
// login (it bypasses the callout and may subscribe to $SYS.REQ.USER.AUTH).
// The buckets must exist (controlplane.New provisions them).
func New(ctx context.Context, conn *bus.Conn, cfg Config, log *zap.Logger) (*Callout, error) {
	kp, err := nkeys.FromSeed(cfg.IssuerSeed)
	if err != nil {
		return nil, fmt.Errorf("auth callout: issuer seed: %w", err)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, errors.New("auth callout: the issuer seed must be an account nkey seed (SA...); make one with `nsc generate nkey --account` or `warmfleet serve --auth` (which generates it)")
	}
	a := &Callout{conn: conn, log: log.Named("auth"), kp: kp, now: cfg.Now}
	if a.now == nil {
		a.now = time.Now
	}
	if a.producers, a.operator, err = hashSecrets(cfg.Producers, cfg.OperatorToken); err != nil {
		return nil, err
	}
	for b, kv := range map[string]*jetstream.KeyValue{bus.BucketNodes: &a.nodesKV, bus.BucketEnroll: &a.enrollKV,
		bus.BucketRentals: &a.rentalsKV, bus.BucketRuns: &a.runsKV, bus.BucketArtifactGrants: &a.grantsKV} {
		if *kv, err = conn.JS.KeyValue(ctx, b); err != nil {
			return nil, fmt.Errorf("auth callout: open %s: %w", b, err)
		}
	}
	return a, nil
}

// Issuer is the public account key nats-server must trust for callout
// answers (auth_callout { issuer: ... }).
func (a *Callout) Issuer() string {
	pub, _ := a.kp.PublicKey()
	return pub
}

// Serve answers authorization requests until ctx ends or stop is called.
// Several control-plane replicas share the requests through a queue group
// of their own (not the request server's: a callout request is a signed
// JWT answered with one, and one that is not valid gets no answer).
func (a *Callout) Serve(ctx context.Context) (stop func(), err error) {
	sub, err := a.conn.NC.QueueSubscribe(bus.AuthCalloutSubject, "warmfleet-auth", func(m *nats.Msg) { a.handle(ctx, m) })
	if err != nil {
		return nil, fmt.Errorf("auth callout: subscribe %s: %w (is this the service user named in auth_callout.auth_users?)", bus.AuthCalloutSubject, err)
	}
	if err := a.conn.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("auth callout: %w", err)
	}
	a.log.Info("auth callout serving", zap.String("issuer", a.Issuer()), zap.Int("producers", len(a.producers)), zap.Bool("operator", a.operator != ""))
	return func() { _ = sub.Unsubscribe() }, nil
}

// handle answers one request. A request that is not a valid authorization
// request gets no answer: the server then refuses the login on timeout.
func (a *Callout) handle(ctx context.Context, m *nats.Msg) {
	req, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
	if err != nil {
		a.log.Warn("auth callout: not an authorization request", zap.Error(err))
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	g, err := a.authorize(rctx, req.ConnectOptions)
	res := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	res.Audience = req.Server.ID
	if err == nil {
		res.Jwt, err = a.userJWT(req.UserNkey, g)
	}
	host := req.ClientInformation.Host
	if err != nil {
		var ref *Refusal
		if !errors.As(err, &ref) {
			// An internal failure (KV unavailable): say so without detail to
			// the client; log it here.
			a.log.Error("auth callout: could not decide a login", zap.String("user", req.ConnectOptions.Username), zap.String("client_host", host), zap.Error(err))
			err = &Refusal{User: req.ConnectOptions.Username, Reason: "the control plane could not check these credentials now; retry"}
		} else {
			a.log.Warn("NATS login refused", zap.String("user", ref.User), zap.String("client_host", host), zap.String("client_name", req.ConnectOptions.Name), zap.String("reason", ref.Reason))
		}
		res.Jwt, res.Error = "", err.Error()
	} else {
		a.log.Info("NATS login", zap.String("as", g.kind), zap.String("user", g.name), zap.String("client_host", host), zap.String("client_name", req.ConnectOptions.Name))
	}
	tok, err := res.Encode(a.kp)
	if err != nil {
		a.log.Error("auth callout: sign response", zap.Error(err))
		return
	}
	if err := m.Respond([]byte(tok)); err != nil {
		a.log.Warn("auth callout: respond", zap.Error(err))
	}
}

// userJWT issues the NATS user for one grant, bound to the server's
// one-time user key so it cannot be replayed.
func (a *Callout) userJWT(userNkey string, g grant) (string, error) {
	uc := jwt.NewUserClaims(userNkey)
	uc.Name = g.kind + ":" + g.name
	uc.Audience = "$G" // the global account: no accounts are configured
	if !g.expires.IsZero() {
		uc.Expires = g.expires.Unix()
	}
	if g.perms != nil {
		uc.Pub.Allow.Add(g.perms.Publish...)
		uc.Sub.Allow.Add(g.perms.Subscribe...)
		if g.perms.Responses {
			uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
		}
	}
	return uc.Encode(a.kp)
}

// authorize maps the CONNECT's user and secret to a grant: the operator's
// token first, then the user's form says which identity it claims (a log
// login holds a slash, an artifact login ends in @artifact), then the
// producers, then an agent by session or invitation.
func (a *Callout) authorize(ctx context.Context, o jwt.ConnectOptions) (grant, error) {
	user, secret := o.Username, o.Password
	if secret == "" {
		secret = o.Token
	}
	if secret == "" {
		return grant{}, &Refusal{User: user, Reason: "no secret presented; an agent logs in with its node id and its bootstrap or session token " +
			"(warmfleet-agent --nats-auth), a producer with --user <name> --password <producer token>, an operator with --user operator --password <operator token>"}
	}
	h := schemas.TokenHash(secret)
	if g, ok, err := a.authorizeOperator(user, h); ok || err != nil {
		return g, err
	}
	if bus.IsNodeLogUser(user) {
		return a.authorizeRunLogs(ctx, user, secret, h)
	}
	if bus.IsArtifactUser(user) {
		return a.authorizeArtifact(ctx, user, secret)
	}
	if g, ok, err := a.authorizeProducer(user, h); ok || err != nil {
		return g, err
	}
	return a.authorizeNode(ctx, user, secret, h)
}
