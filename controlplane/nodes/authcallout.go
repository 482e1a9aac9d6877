package nodes

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// AuthConfig configures the auth callout: who may log in to NATS, and as
// what. Secrets are hashed when the callout is built and never kept or
// logged in the clear.
type AuthConfig struct {
	// IssuerSeed is the account nkey seed (SA...) that signs the users the
	// callout issues; nats-server is configured with its public key.
	IssuerSeed []byte
	// Producers maps a producer's name to its token.
	Producers map[string]string
	// OperatorToken logs in user "operator" with full permissions; empty
	// admits no operator (the control plane's own login still works).
	OperatorToken string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// authGrant is what one login is allowed, and until when.
type authGrant struct {
	kind    string // enrolling, node, node-logs, producer, operator
	name    string // node id, NodeLogUser, producer name, "operator"
	perms   *bus.Permissions
	expires time.Time // zero: no expiry
}

// AuthRefusal is why a login was refused. Its message names what is wrong
// and what to do, and never the secret presented.
type AuthRefusal struct {
	User   string
	Reason string
}

func (e *AuthRefusal) Error() string {
	if e.User == "" {
		return "warmfleet: login refused: " + e.Reason
	}
	return fmt.Sprintf("warmfleet: login as %q refused: %s", e.User, e.Reason)
}

// AuthCallout answers nats-server's authorization requests: it turns a
// warmfleet secret (invitation, session, artifact login, producer or
// operator token) into a NATS user with exactly that identity's
// permissions (bus.Perms*). It reads wf_enroll, wf_nodes, wf_rentals and
// wf_runs; an invitation is checked, not redeemed, at login (enrollment
// redeems it). Its one write: an artifact login's grant in
// wf_artifact_grants is deleted at its revision when it is used, so it
// admits one login.
type AuthCallout struct {
	conn      *bus.Conn
	log       *zap.Logger
	kp        nkeys.KeyPair
	nodesKV   jetstream.KeyValue
	enrollKV  jetstream.KeyValue
	rentalsKV jetstream.KeyValue
	runsKV    jetstream.KeyValue
	grantsKV  jetstream.KeyValue
	producers map[string]string // name -> token hash
	operator  string            // token hash
	now       func() time.Time
}

// NewAuthCallout prepares the callout on conn, which must be the auth
// service's own login (it bypasses the callout and may subscribe to
// $SYS.REQ.USER.AUTH). The buckets must exist (controlplane.New provisions
// them).
func NewAuthCallout(ctx context.Context, conn *bus.Conn, cfg AuthConfig, log *zap.Logger) (*AuthCallout, error) {
	kp, err := nkeys.FromSeed(cfg.IssuerSeed)
	if err != nil {
		return nil, fmt.Errorf("auth callout: issuer seed: %w", err)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, errors.New("auth callout: the issuer seed must be an account nkey seed (SA...); make one with `nsc generate nkey --account` or `warmfleet serve --auth` (which generates it)")
	}
	a := &AuthCallout{conn: conn, log: log.Named("auth"), kp: kp, producers: map[string]string{}, now: cfg.Now}
	if a.now == nil {
		a.now = time.Now
	}
	for name, tok := range cfg.Producers {
		if !bus.SubjectToken(name) || bus.IsNodeLogUser(name) || bus.IsArtifactUser(name) || name == bus.OperatorUser {
			return nil, fmt.Errorf("auth callout: producer name %q must be one subject token (no dots, slashes, @, spaces or wildcards) and not %q", name, bus.OperatorUser)
		}
		if len(tok) < 16 {
			return nil, fmt.Errorf("auth callout: producer %q: its token is shorter than 16 characters; use `openssl rand -base64 32`", name)
		}
		a.producers[name] = hashToken(tok)
	}
	if cfg.OperatorToken != "" {
		if len(cfg.OperatorToken) < 16 {
			return nil, errors.New("auth callout: the operator token is shorter than 16 characters; use `openssl rand -base64 32`")
		}
		a.operator = hashToken(cfg.OperatorToken)
	}
	if a.nodesKV, err = conn.JS.KeyValue(ctx, bus.BucketNodes); err != nil {
		return nil, fmt.Errorf("auth callout: open %s: %w", bus.BucketNodes, err)
	}
	if a.enrollKV, err = conn.JS.KeyValue(ctx, bus.BucketEnroll); err != nil {
		return nil, fmt.Errorf("auth callout: open %s: %w", bus.BucketEnroll, err)
	}
	if a.rentalsKV, err = conn.JS.KeyValue(ctx, bus.BucketRentals); err != nil {
		return nil, fmt.Errorf("auth callout: open %s: %w", bus.BucketRentals, err)
	}
	if a.runsKV, err = conn.JS.KeyValue(ctx, bus.BucketRuns); err != nil {
		return nil, fmt.Errorf("auth callout: open %s: %w", bus.BucketRuns, err)
	}
	if a.grantsKV, err = conn.JS.KeyValue(ctx, bus.BucketArtifactGrants); err != nil {
		return nil, fmt.Errorf("auth callout: open %s: %w", bus.BucketArtifactGrants, err)
	}
	return a, nil
}

// Issuer is the public account key nats-server must trust for callout
// answers (auth_callout { issuer: ... }).
func (a *AuthCallout) Issuer() string {
	pub, _ := a.kp.PublicKey()
	return pub
}

// Run serves authorization requests until ctx ends. Several control-plane
// replicas share the requests through a queue group.
func (a *AuthCallout) Run(ctx context.Context) error {
	sub, err := a.conn.NC.QueueSubscribe(bus.AuthCalloutSubject, "warmfleet-auth", func(m *nats.Msg) { a.handle(ctx, m) })
	if err != nil {
		return fmt.Errorf("auth callout: subscribe %s: %w (is this the service user named in auth_callout.auth_users?)", bus.AuthCalloutSubject, err)
	}
	if err := a.conn.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("auth callout: %w", err)
	}
	a.log.Info("auth callout serving", zap.String("issuer", a.Issuer()), zap.Int("producers", len(a.producers)), zap.Bool("operator", a.operator != ""))
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return nil
}

// handle answers one request. A request that is not a valid authorization
// request gets no answer: the server then refuses the login on timeout.
func (a *AuthCallout) handle(ctx context.Context, m *nats.Msg) {
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
		var ref *AuthRefusal
		if !errors.As(err, &ref) {
			// An internal failure (KV unavailable): say so without detail to
			// the client; log it here.
			a.log.Error("auth callout: could not decide a login", zap.String("user", req.ConnectOptions.Username), zap.String("client_host", host), zap.Error(err))
			err = &AuthRefusal{User: req.ConnectOptions.Username, Reason: "the control plane could not check these credentials now; retry"}
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
func (a *AuthCallout) userJWT(userNkey string, g authGrant) (string, error) {
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

// authorize maps the CONNECT's user and secret to a grant.
func (a *AuthCallout) authorize(ctx context.Context, o jwt.ConnectOptions) (authGrant, error) {
	user, secret := o.Username, o.Password
	if secret == "" {
		secret = o.Token
	}
	if secret == "" {
		return authGrant{}, &AuthRefusal{User: user, Reason: "no secret presented; an agent logs in with its node id and its bootstrap or session token " +
			"(warmfleet-agent --nats-auth), a producer with --user <name> --password <producer token>, an operator with --user operator --password <operator token>"}
	}
	h := hashToken(secret)
	if user == bus.OperatorUser || user == "" {
		if a.operator != "" && subtle.ConstantTimeCompare([]byte(h), []byte(a.operator)) == 1 {
			return authGrant{kind: "operator", name: bus.OperatorUser}, nil
		}
		if user == bus.OperatorUser {
			return authGrant{}, &AuthRefusal{User: user, Reason: "not the operator token set with `warmfleet serve --operator-token-file`"}
		}
	}
	if bus.IsNodeLogUser(user) {
		return a.authorizeRunLogs(ctx, user, secret, h)
	}
	if bus.IsArtifactUser(user) {
		return a.authorizeArtifact(ctx, user, secret)
	}
	if want, ok := a.producers[user]; ok {
		if subtle.ConstantTimeCompare([]byte(h), []byte(want)) == 1 {
			p := bus.PermsProducer(user)
			return authGrant{kind: "producer", name: user, perms: &p}, nil
		}
		return authGrant{}, &AuthRefusal{User: user, Reason: "not this producer's token (set with `warmfleet serve --producer-tokens-file`)"}
	}
	if !tokenWellFormed(secret) {
		return authGrant{}, &AuthRefusal{User: user, Reason: "unknown user, or a secret that is not a warmfleet token; agents present their bootstrap's enrollment token or their session token, producers a name listed in --producer-tokens-file"}
	}
	// An agent that enrolled logs in with its session token.
	if user != "" {
		rec, ok, err := a.nodeSession(ctx, user, h)
		if err != nil {
			return authGrant{}, err
		}
		if ok {
			if !a.now().Before(rec.SessionExpires) && bus.SubjectToken(user) && resumeUnderWay(ctx, a.rentalsKV, rec) > 0 {
				// Its stopped rental is being resumed: the machine may
				// enroll again with this session (controlplane/rentals), then log in
				// with the new one.
				p := bus.PermsEnrolling(user)
				return authGrant{kind: "enrolling", name: user, perms: &p, expires: a.now().Add(DefaultInviteTTL)}, nil
			}
			if err := a.sessionRefusal(user, user, rec); err != nil {
				return authGrant{}, err
			}
			p := bus.PermsNode(user)
			return authGrant{kind: "node", name: user, perms: &p, expires: rec.SessionExpires}, nil
		}
	}
	// An agent on first boot logs in with its invitation, which is checked
	// and left for enrollment to redeem.
	var inv schemas.Invitation
	_, err := bus.GetJSON(ctx, a.enrollKV, inviteKey(secret), &inv)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return authGrant{}, &AuthRefusal{User: user, Reason: "not a current invitation or session of this node: an invitation works until the node enrolls with it, " +
			"then the agent logs in with its session token (kept in its data dir); mint a new bootstrap with `warmfleet node invite`"}
	case err != nil:
		return authGrant{}, fmt.Errorf("read invitation: %w", err)
	case !a.now().Before(inv.ExpiresAt):
		return authGrant{}, &AuthRefusal{User: user, Reason: "the invitation expired at " + inv.ExpiresAt.UTC().Format(time.RFC3339) + "; mint a new one with `warmfleet node invite`"}
	case user != "" && user != inv.NodeID:
		return authGrant{}, &AuthRefusal{User: user, Reason: "this invitation was minted for another node; use the bootstrap file as minted"}
	case !bus.SubjectToken(inv.NodeID):
		return authGrant{}, &AuthRefusal{User: user, Reason: "a node id used with NATS auth must not contain dots or wildcards; invite the node under another id"}
	}
	p := bus.PermsEnrolling(inv.NodeID)
	return authGrant{kind: "enrolling", name: inv.NodeID, perms: &p, expires: inv.ExpiresAt}, nil
}

// nodeSession reads nodeID's wf_nodes record and reports whether h is the
// hash of its session token, expired or not. No record is not an error.
func (a *AuthCallout) nodeSession(ctx context.Context, nodeID, h string) (schemas.NodeRecord, bool, error) {
	var rec schemas.NodeRecord
	_, err := bus.GetJSON(ctx, a.nodesKV, nodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey):
		return rec, false, nil
	case err != nil:
		return rec, false, fmt.Errorf("read node %s: %w", nodeID, err)
	}
	return rec, rec.SessionTokenHash != "" && subtle.ConstantTimeCompare([]byte(rec.SessionTokenHash), []byte(h)) == 1, nil
}

// sessionRefusal says why node nodeID's matching session cannot log in
// (as user) now: it expired, or the id cannot be a subject token. Nil when
// it can.
func (a *AuthCallout) sessionRefusal(user, nodeID string, rec schemas.NodeRecord) error {
	if !a.now().Before(rec.SessionExpires) {
		return &AuthRefusal{User: user, Reason: "this node's session expired at " + rec.SessionExpires.UTC().Format(time.RFC3339) +
			"; re-invite the node (`warmfleet node invite`) and restart the agent with the new bootstrap"}
	}
	if !bus.SubjectToken(nodeID) {
		return &AuthRefusal{User: user, Reason: "a node id used with NATS auth must not contain dots or wildcards; re-invite the node under another id"}
	}
	return nil
}

// authorizeRunLogs admits an agent's log connection for one Run
// (bus.NodeLogUser): the node's live session token, and the Run's current
// attempt booked on that node, in any phase (the tail of a finished attempt
// may still be on its way).
func (a *AuthCallout) authorizeRunLogs(ctx context.Context, user, secret, h string) (authGrant, error) {
	nodeID, runID, ok := bus.ParseNodeLogUser(user)
	if !ok {
		return authGrant{}, &AuthRefusal{User: user, Reason: "a log login's user is <node id>/<run id>, each without dots, slashes or wildcards (bus.NodeLogUser)"}
	}
	if !tokenWellFormed(secret) {
		return authGrant{}, &AuthRefusal{User: user, Reason: "not a warmfleet token; a log login presents the node's session token (the one the agent logs in with)"}
	}
	rec, ok, err := a.nodeSession(ctx, nodeID, h)
	if err != nil {
		return authGrant{}, err
	}
	if !ok {
		return authGrant{}, &AuthRefusal{User: user, Reason: "not the current session token of node " + nodeID +
			"; a log login presents the session token the agent logs in with (not its invitation), so it works only once the node has enrolled"}
	}
	if err := a.sessionRefusal(user, nodeID, rec); err != nil {
		return authGrant{}, err
	}
	var run schemas.Run
	_, err = bus.GetJSON(ctx, a.runsKV, runID, &run)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey):
		return authGrant{}, &AuthRefusal{User: user, Reason: "no Run " + runID + " in " + bus.BucketRuns + "; an agent ships output only for Runs booked on it (`warmfleet run get " + runID + "`)"}
	case err != nil:
		return authGrant{}, fmt.Errorf("read run %s: %w", runID, err)
	case run.NodeID == "":
		return authGrant{}, &AuthRefusal{User: user, Reason: fmt.Sprintf("Run %s's current attempt (%d) is booked on no node; an agent ships output only for the attempt booked on it", runID, run.Attempt)}
	case run.NodeID != nodeID:
		return authGrant{}, &AuthRefusal{User: user, Reason: fmt.Sprintf("Run %s's current attempt (%d) is booked on node %s, not %s; an agent ships output only for the attempt booked on it", runID, run.Attempt, run.NodeID, nodeID)}
	}
	p := bus.PermsNodeLogs(nodeID, runID)
	return authGrant{kind: "node-logs", name: user, perms: &p, expires: rec.SessionExpires}, nil
}

// authorizeArtifact admits an agent's one-time artifact login
// (bus.ArtifactUser): the token's grant in wf_artifact_grants, for this
// node, not expired, minted for the node's current session, and not used
// before. Admitting it deletes the grant at the revision read, so of two
// logins with one token at most one gets in. The user may read the
// artifact object store until the grant expires (bus.PermsArtifactReader).
func (a *AuthCallout) authorizeArtifact(ctx context.Context, user, secret string) (authGrant, error) {
	nodeID, ok := bus.ParseArtifactUser(user)
	if !ok {
		return authGrant{}, &AuthRefusal{User: user, Reason: "an artifact login's user is <node id>@artifact (bus.ArtifactUser), the id without dots, slashes or wildcards"}
	}
	if !tokenWellFormed(secret) {
		return authGrant{}, &AuthRefusal{User: user, Reason: "not a warmfleet token; an artifact login presents the one-time token the control plane answered on wf.node.<id>.credentials.artifact"}
	}
	key := schemas.ArtifactGrantKey(secret)
	var g schemas.ArtifactGrant
	rev, err := bus.GetJSON(ctx, a.grantsKV, key, &g)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return authGrant{}, &AuthRefusal{User: user, Reason: "not a current artifact login: each is good for one login before it expires; ask wf.node.<id>.credentials.artifact for a new one"}
	case err != nil:
		return authGrant{}, fmt.Errorf("read artifact grant: %w", err)
	case g.NodeID != nodeID:
		return authGrant{}, &AuthRefusal{User: user, Reason: "this artifact login was minted for another node; log in as the user it was answered with"}
	case !a.now().Before(g.ExpiresAt):
		return authGrant{}, &AuthRefusal{User: user, Reason: "this artifact login expired at " + g.ExpiresAt.UTC().Format(time.RFC3339) + "; ask for a new one"}
	}
	var rec schemas.NodeRecord
	_, err = bus.GetJSON(ctx, a.nodesKV, nodeID, &rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return authGrant{}, &AuthRefusal{User: user, Reason: "node " + nodeID + " is not enrolled"}
	case err != nil:
		return authGrant{}, fmt.Errorf("read node %s: %w", nodeID, err)
	case rec.FencingToken != g.FencingToken:
		return authGrant{}, &AuthRefusal{User: user, Reason: fmt.Sprintf("this artifact login was minted for session %d of node %s, which is now at %d; the current session asks for a new one", g.FencingToken, nodeID, rec.FencingToken)}
	case !a.now().Before(rec.SessionExpires):
		return authGrant{}, &AuthRefusal{User: user, Reason: "node " + nodeID + "'s session expired; it asks for a new login once it has enrolled again"}
	}
	if err := a.grantsKV.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSequence(err) {
			return authGrant{}, &AuthRefusal{User: user, Reason: "this artifact login was used already; each is good for one login"}
		}
		return authGrant{}, fmt.Errorf("use artifact grant: %w", err)
	}
	p := bus.PermsArtifactReader(nodeID)
	return authGrant{kind: "artifact", name: user, perms: &p, expires: g.ExpiresAt}, nil
}

// isWrongLastSequence reports JetStream's answer to a write at a stale
// revision.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// ParseProducerTokens reads `name token` lines (blank lines and lines
// starting with # are skipped), as in the file given to
// `warmfleet serve --producer-tokens-file`.
func ParseProducerTokens(text string) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("producer tokens: line %d: want `<name> <token>`", i+1)
		}
		if !bus.SubjectToken(f[0]) || bus.IsNodeLogUser(f[0]) || bus.IsArtifactUser(f[0]) || f[0] == bus.OperatorUser {
			// The name becomes part of the producer's permission subjects;
			// a slash marks an agent's log login, an @ its artifact login.
			return nil, fmt.Errorf("producer tokens: line %d: a producer name must be one subject token (no dots, slashes, @, wildcards or spaces) and not %q", i+1, bus.OperatorUser)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("producer tokens: line %d: producer %q is listed twice", i+1, f[0])
		}
		out[f[0]] = f[1]
	}
	return out, nil
}

// ProducerNames lists the configured producers, sorted (for logs).
func ProducerNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
