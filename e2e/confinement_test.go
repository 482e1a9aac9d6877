package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/identities"
	"github.com/warmfleet/warmfleet/schemas"
)

// The values the probes are built from: each identity's own, and another
// node's, Run's and producer's.
const (
	confNode, confOtherNode, confEnrolling = "node-a", "node-b", "node-e"
	confRun, confOtherRun                  = "run-a", "run-b"
	confTenant, confOtherTenant            = "acme", "other"
	confSession                            = "s1"
	confConsumer, confOtherConsumer        = "artifact_node-a_probe", "artifact_node-b_probe"
	confInvite, confOtherInvite            = "00000000000000000000000000000000", "11111111111111111111111111111111"
	probeToken                             = "probe"
)

// TestAcceptance_IdentityConfinement: for every row of docs/security.md's
// identity table, a real login of that identity (through the control
// plane's auth callout, over TLS) is refused every probe subject outside
// its row, for publish and for subscribe, and allowed those inside it; a
// request it receives may be answered only where its row says so. The
// probes are generated: every row's patterns for its own and other ids,
// bus's subject constants and subject families for two nodes, Runs and
// tenants, every JetStream API of nats-server for every stream, bucket and
// consumer the control plane provisions, and wildcard subscriptions.
func TestAcceptance_IdentityConfinement(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := identities.ParseTable(string(page))
	if err != nil {
		t.Fatal(err)
	}
	// The Run booked for the log login is never resent while the test runs.
	sf := newSecureFleet(t, func(c *controlplane.Config) { c.RedispatchAfter = time.Hour })
	// Thousands of refusals are expected: nats-server's line for each is
	// counted, not logged.
	quiet := &quietViolations{natsLogger: natsLogger{sf.log.Named("nats-server")}}
	sf.nats.Embedded.Server().SetLoggerV2(quiet, true, false, false)
	logins := sf.confinementLogins()
	probes := confinementProbes(t, rows)
	t.Logf("%d probe subjects, %d identities", len(probes), len(rows))

	start := time.Now()
	var wg sync.WaitGroup
	for i, r := range rows {
		l, ok := logins[r.Identity]
		if !ok {
			t.Errorf("identity %q (security.md line %d): the test has no login for it", r.Identity, r.Line)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sf.confine(t, i, r, l, probes)
		}()
	}
	wg.Wait()
	t.Logf("probed every identity in %v; nats-server logged %d violations", time.Since(start).Round(time.Millisecond), quiet.n.Load())
}

// quietViolations is natsLogger without the permission violation lines.
type quietViolations struct {
	natsLogger
	n atomic.Int64
}

func (q *quietViolations) Errorf(format string, v ...any) {
	if line := fmt.Sprintf(format, v...); strings.Contains(line, " Violation - ") {
		q.n.Add(1)
		return
	}
	q.natsLogger.Errorf(format, v...)
}

// confinementLogin is one identity's open connection and its own values
// for the table's placeholders.
type confinementLogin struct {
	nc     *nats.Conn
	errs   *violations
	values map[string]string
}

// confinementLogins logs in once as every identity of the table, all
// before probing: a log login is admitted only while its Run is booked on
// its node, and permissions are fixed at login.
func (sf *secureFleet) confinementLogins() map[string]confinementLogin {
	t := sf.t
	t.Helper()
	ctx := context.Background()
	// The fleet's producer is named as its tenant, and the booked Run is
	// that tenant's.
	own := map[string]string{identities.PlaceholderNode: confNode, identities.PlaceholderRun: confRun, identities.PlaceholderProducer: confTenant,
		identities.PlaceholderTenant: confTenant, identities.PlaceholderConsumer: confConsumer}
	producer := bus.ProducerCredentials(sf.producerName, sf.producerToken).Options()
	operatorToken := sf.secrets["operator token"]
	out := map[string]confinementLogin{
		"control plane": sf.confinementDial("control plane", nil, nats.UserInfo("warmfleet-cp", sf.secrets["service password"])),
		"operator":      sf.confinementDial("operator", nil, bus.OperatorCredentials(operatorToken).Options()...),
		"producer":      sf.confinementDial("producer", own, producer...),
		"CLI":           sf.confinementDial("CLI", nil, sf.cliOptions(operatorToken, "")...),
		"CLI as a producer": sf.confinementDial("CLI as a producer", own,
			sf.cliOptions(sf.producerToken, sf.producerName)...),
	}

	// An invitation never redeemed: the enrolling identity.
	e := sf.invite(confEnrolling, 1, 15*time.Minute)
	invite := strings.TrimPrefix(bus.EnrollingInboxPrefix(confEnrolling, e.EnrollmentToken), bus.EnrollInboxRoot(confEnrolling)+".")
	out["enrolling node"] = sf.confinementDial("enrolling node", map[string]string{identities.PlaceholderNode: confEnrolling, identities.PlaceholderInvite: invite},
		bus.AgentCredentials(confEnrolling, e.EnrollmentToken, e.EnrollmentToken).Options()...)

	// A node enrolled by hand (no agent takes its commands or answers its
	// requests): its session logs in as the node and as the log login.
	enr := sf.enrollByHand(confNode)
	out["node"] = sf.confinementDial("node", own, bus.NodeCredentials(confNode, enr.SessionToken).Options()...)
	sf.bookRun(confRun, confNode, enr.FencingToken)
	out["log login"] = sf.confinementDial("log login", own, bus.NodeLogCredentials(confNode, confRun, enr.SessionToken).Options()...)

	// A one-time artifact grant for the node's session, as
	// controlplane/artifactauth writes one.
	token := randomSecret(t)
	grant, _ := json.Marshal(schemas.ArtifactGrant{NodeID: confNode, FencingToken: enr.FencingToken, Digest: "sha256:" + strings.Repeat("1", 64),
		Object: "sha256/" + strings.Repeat("1", 64), Consumer: confConsumer, RunID: confRun, ExpiresAt: time.Now().Add(15 * time.Minute)})
	grants, err := sf.conn.JS.KeyValue(ctx, bus.BucketArtifactGrants)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grants.Create(ctx, schemas.ArtifactGrantKey(token), grant); err != nil {
		t.Fatal(err)
	}
	anc, err := bus.DialArtifactLogin(ctx, bus.Transport{URL: sf.url, Options: sf.tls}, confNode, bus.ArtifactUser(confNode), token)
	if err != nil {
		t.Fatalf("artifact login: %v", err)
	}
	t.Cleanup(anc.Close)
	errs := &violations{}
	anc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) })
	out["artifact login"] = confinementLogin{nc: anc, errs: errs, values: own}
	return out
}

// cliOptions are the warmfleet CLI's login (bus.EnvClientOptions) from the
// environment it reads: a token file, and a producer name or none.
func (sf *secureFleet) cliOptions(token, producer string) []nats.Option {
	t := sf.t
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{bus.EnvNATSUser, bus.EnvNATSCAFile, bus.EnvNATSCertFile, bus.EnvNATSKeyFile, "WARMFLEET_NATS_TOKEN"} {
		t.Setenv(k, "")
	}
	t.Setenv(bus.EnvNATSTokenFile, file)
	t.Setenv(bus.EnvNATSInboxName, producer)
	opts, err := bus.EnvClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func (sf *secureFleet) confinementDial(name string, values map[string]string, opts ...nats.Option) confinementLogin {
	t := sf.t
	t.Helper()
	errs := &violations{}
	all := append([]nats.Option{nats.Name("confinement " + name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) })}, sf.tls...)
	nc, err := nats.Connect(sf.url, append(all, opts...)...)
	if err != nil {
		t.Fatalf("log in as %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return confinementLogin{nc: nc, errs: errs, values: values}
}

// enrollByHand redeems an invitation for nodeID on an enrolling login, as
// an agent's first boot does, and returns the session.
func (sf *secureFleet) enrollByHand(nodeID string) schemas.Enrollment {
	t := sf.t
	t.Helper()
	boot := sf.invite(nodeID, 1, time.Minute)
	nc, err := nats.Connect(sf.url, append(append([]nats.Option{}, sf.tls...), bus.AgentCredentials(nodeID, boot.EnrollmentToken, boot.EnrollmentToken).Options()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req, _ := json.Marshal(schemas.EnrollmentRequest{NodeID: nodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken, AgentVersion: agent.Version})
	resp, err := nc.Request(bus.SubjectEnroll, req, 10*time.Second)
	if err != nil {
		t.Fatalf("enroll %s: %v", nodeID, err)
	}
	var rep schemas.Reply[schemas.Enrollment]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("enroll %s: %v %+v", nodeID, err, rep.Refusal)
	}
	return *rep.OK
}

// bookRun writes a Run placed on nodeID into wf_runs, which a log login
// for it needs.
func (sf *secureFleet) bookRun(runID, nodeID string, fencing uint64) {
	t := sf.t
	t.Helper()
	now := time.Now().UTC()
	r := schemas.Run{ID: runID, Tenant: confTenant, Request: schemas.RunRequest{RequestID: runID, Image: testImage, Command: []string{"true"}},
		Phase: schemas.PhasePlaced, PhaseSince: now, Attempt: 1, NodeID: nodeID, AttemptID: runID + "-1", FencingToken: fencing,
		CreatedAt: now, UpdatedAt: now}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sf.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), runID, b); err != nil {
		t.Fatal(err)
	}
}

// violations are the permission violations the server sent one
// connection, by operation ("publish", "subscription") and subject.
type violations struct {
	mu   sync.Mutex
	seen map[[2]string]bool
	n    int
}

var violationForm = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]*)"`)

func (v *violations) add(err error) {
	m := violationForm.FindStringSubmatch(err.Error())
	if m == nil {
		return // a slow consumer on a probe subscription, say
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = map[[2]string]bool{}
	}
	v.seen[[2]string{strings.ToLower(m[1]), m[2]}] = true
	v.n++
}

func (v *violations) refused(op, subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seen[[2]string{op, subject}]
}

func (v *violations) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n
}

// settle waits until every violation the server sent before a flush has
// reached the handler: the count stops changing.
func (v *violations) settle(nc *nats.Conn) error {
	if err := nc.FlushTimeout(30 * time.Second); err != nil {
		return err
	}
	last := -1
	for n := v.count(); n != last; n = v.count() {
		last = n
		time.Sleep(150 * time.Millisecond)
	}
	return nil
}

// confine probes one identity's login with every probe and compares what
// the server refused with what its row allows.
func (sf *secureFleet) confine(t *testing.T, i int, r identities.Row, l confinementLogin, probes []string) {
	pub := identities.Instantiate(r.Publish, l.values)
	sub := identities.Instantiate(r.Subscribe, l.values)
	// Its own patterns are probes too: a value only this login knows (its
	// invitation's inbox token) is in no shared probe.
	probes = slices.Clone(probes)
	for _, s := range append(slices.Clone(pub), sub...) {
		probes = append(probes, s, concrete(s, probeToken))
	}
	slices.Sort(probes)
	probes = slices.Compact(probes)
	allowed := func(patterns []string, s string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { return identities.Covers(p, s) })
	}
	var pubIn, pubOut, subIn, subOut []string
	var subs []*nats.Subscription
	for _, s := range probes {
		if !strings.ContainsAny(s, "*>") {
			switch in := allowed(pub, s) && !serverDenies(r.Identity, "publish", s); {
			case !in:
				pubOut = append(pubOut, s)
			case harmless(s):
				pubIn = append(pubIn, s)
			}
		}
		if allowed(sub, s) && !serverDenies(r.Identity, "subscription", s) {
			subIn = append(subIn, s)
		} else {
			subOut = append(subOut, s)
		}
	}
	began := time.Now()
	for _, s := range append(slices.Clone(pubOut), pubIn...) {
		if err := l.nc.Publish(s, []byte(probeToken)); err != nil {
			t.Errorf("%s: publish %s: %v", r.Identity, s, err)
			return
		}
	}
	if err := l.errs.settle(l.nc); err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	published := time.Since(began)
	for _, s := range append(slices.Clone(subOut), subIn...) {
		sub, err := l.nc.SubscribeSync(s)
		if err != nil {
			t.Errorf("%s: subscribe %s: %v", r.Identity, s, err)
			return
		}
		subs = append(subs, sub)
	}
	if err := l.errs.settle(l.nc); err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	check := func(op string, in, out []string) {
		for _, s := range out {
			if !l.errs.refused(op, s) {
				t.Errorf("%s (security.md line %d): %s to %q outside its row was not refused", r.Identity, r.Line, op, s)
			}
		}
		for _, s := range in {
			if l.errs.refused(op, s) {
				t.Errorf("%s (security.md line %d): %s to %q inside its row was refused", r.Identity, r.Line, op, s)
			}
		}
		if len(in) == 0 {
			t.Errorf("%s: no %s probe inside its row; the test would pass whatever the server allowed", r.Identity, op)
		}
	}
	check("publish", pubIn, pubOut)
	check("subscription", subIn, subOut)
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	sf.confineReplies(t, i, r, l, sub)
	t.Logf("%s: %d publishes and %d subscriptions refused, %d and %d allowed (publishes %v, all %v)", r.Identity, len(pubOut), len(subOut), len(pubIn), len(subIn),
		published.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// confineReplies: the operator sends the identity a request on a subject
// it subscribes to; its answer, on a reply subject outside its publish
// patterns, reaches the operator only if its row may answer.
func (sf *secureFleet) confineReplies(t *testing.T, i int, r identities.Row, l confinementLogin, sub []string) {
	at := concrete(sub[0], "reply-"+strconv.Itoa(i))
	reply := "_INBOX.confinement-reply-" + strconv.Itoa(i)
	in, err := l.nc.SubscribeSync(at)
	if err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	answers, err := sf.conn.NC.SubscribeSync(reply)
	if err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	defer func() { _ = answers.Unsubscribe() }()
	if err := l.nc.Flush(); err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	if err := sf.conn.NC.PublishRequest(at, reply, []byte("question")); err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	m, err := in.NextMsg(10 * time.Second)
	if err != nil {
		t.Errorf("%s: the request on %s did not arrive: %v", r.Identity, at, err)
		return
	}
	if err := m.Respond([]byte("answer")); err != nil {
		t.Errorf("%s: %v", r.Identity, err)
		return
	}
	_, err = answers.NextMsg(2 * time.Second)
	switch answered := err == nil; {
	case answered && r.Replies == identities.RepliesNone:
		t.Errorf("%s (security.md line %d): answered a request, which its row does not allow", r.Identity, r.Line)
	case !answered && r.Replies != identities.RepliesNone:
		t.Errorf("%s (security.md line %d): its answer to a request did not arrive (%v)", r.Identity, r.Line, err)
	case !answered:
		if err := l.errs.settle(l.nc); err != nil || !l.errs.refused("publish", reply) {
			t.Errorf("%s: no permissions violation for its answer (%v)", r.Identity, err)
		}
	}
}

// serverDenied prefixes the auth callout's reply subjects, which
// nats-server keeps from every login of a callout account (its
// authCalloutReplySubjects, unexported).
const serverDenied = "$SYS._INBOX"

// serverDenies is nats-server's own rule for an account with an auth
// callout, whatever a login's permissions (docs/security.md, below the
// table): the control plane serves the callout subject and may not publish
// on it; no other login may use it or its replies.
func serverDenies(identity, op, s string) bool {
	if identity == "control plane" {
		return op == "publish" && s == server.AuthCalloutSubject
	}
	return identities.Covers(server.AuthCalloutSubject, s) || identities.Covers(serverDenied+".>", s)
}

// harmless says whether a probe allowed to an identity may really be
// published: the JetStream API's reads may; its writes (create, delete,
// purge, pull, …) and direct writes to KV and object store subjects are
// probed only where they must be refused.
func harmless(s string) bool {
	for _, read := range []string{server.JSApiAccountInfo, server.JSApiStreams, server.JSApiStreamList} {
		if s == read {
			return true
		}
	}
	for _, read := range []string{server.JSApiStreamInfoT, server.JSApiMsgGetT, server.JSDirectMsgGetT, server.JSApiConsumerInfoT, server.JSApiConsumersT, server.JSApiConsumerListT} {
		if strings.HasPrefix(s, read[:strings.Index(read, "%")]) {
			return true
		}
	}
	return !strings.HasPrefix(s, "$JS.API.") && !strings.HasPrefix(s, "$KV.") && !strings.HasPrefix(s, "$O.") && !strings.HasPrefix(s, "$SYS.")
}

// concrete turns a pattern into a subject it matches, each wildcard token
// replaced by tok.
func concrete(pattern, tok string) string {
	toks := strings.Split(pattern, ".")
	for i, t := range toks {
		if t == "*" || t == ">" {
			toks[i] = tok
		}
	}
	return strings.Join(toks, ".")
}
