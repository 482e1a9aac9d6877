package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/nodehost"
	"github.com/warmfleet/warmfleet/schemas"
)

// secureFleet is a fleet with NATS auth (the control plane's auth callout)
// and TLS with client certificates on: every part logs in with its own
// identity over TLS.
type secureFleet struct {
	*fleet
	url      string
	tls      []nats.Option // client TLS options, from a throwaway CA
	pki      bus.DevPKI    // that CA's files, for parts started as processes
	logs     *observer.ObservedLogs
	secrets  map[string]string // what must never be at rest: name -> value
	secretMu sync.Mutex

	producerName, producerToken string
	// runtime is the runtime of each agent started (by data dir); nil: a
	// no-op runtime whose workloads exit 0 after workloadTime (200ms when
	// zero).
	runtime      func(dataDir string, log *zap.Logger) noderuntime.Runtime
	workloadTime time.Duration
}

const testImage = "localhost/busybox@sha256:293b61c04e6cc91c9c17343b579b3be84b0cfe4881ad4f9018ab3a023e69e263"

func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func newSecureFleet(t *testing.T, tune ...func(*controlplane.Config)) *secureFleet {
	t.Helper()
	pki, err := bus.GenerateDevPKI(t.TempDir(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tlsOpts, err := pki.Client().ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := issuer.Seed()
	issuerPub, _ := issuer.PublicKey()
	servicePassword, operatorToken, producerToken := randomSecret(t), randomSecret(t), randomSecret(t)

	storeDir := t.TempDir()
	srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: storeDir, Port: -1, TLS: pki.Server(true),
		Auth: &bus.EmbeddedAuth{ServiceUser: "warmfleet-cp", ServicePassword: servicePassword, Issuer: issuerPub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	// Every log line of every part is kept, at debug level, to be searched
	// for secrets.
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), core))

	// The server's own log (debug, not trace: trace prints payloads) goes
	// to the same place.
	srv.Server().SetLoggerV2(natsLogger{log.Named("nats-server")}, true, false, false)

	sf := &secureFleet{url: srv.URL(), tls: tlsOpts, pki: pki, logs: logs, producerName: "acme", producerToken: producerToken,
		secrets: map[string]string{"service password": servicePassword, "operator token": operatorToken,
			"producer token": producerToken, "issuer seed": string(seed)}}

	cpConn, err := bus.Connect(sf.url, "warmfleet-cp", log.Named("cp"), append(tlsOpts, nats.UserInfo("warmfleet-cp", servicePassword))...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cpConfig()
	cfg.OpenEnrollment = false
	// The producer acts for its own tenant, named as it is.
	cfg.Auth = &admission.Config{IssuerSeed: seed, Producers: map[string]admission.Producer{sf.producerName: {Token: producerToken, Tenant: sf.producerName}}, OperatorToken: operatorToken}
	cfg.Tenants = []string{sf.producerName}
	for _, fn := range tune {
		fn(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, cpConn, cfg, log.Named("cp"))
	if err != nil {
		t.Fatal(err)
	}
	p := newPart(cancel, func() error {
		defer cpConn.Close()
		return cp.Run(ctx)
	})
	t.Cleanup(func() { p.stop(t) })
	select {
	case <-cp.Ready():
	case <-p.done:
		t.Fatalf("control plane stopped: %v", p.err)
	case <-time.After(60 * time.Second):
		t.Fatal("control plane not ready in 60s")
	}

	// The operator's connection (full permissions) drives the harness.
	opConn, err := bus.Connect(sf.url, "operator", log.Named("operator"), append(append([]nats.Option{}, tlsOpts...), bus.OperatorCredentials(operatorToken).Options()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opConn.Close)
	if err := opConn.WaitConnected(context.Background()); err != nil {
		t.Fatal(err)
	}
	sf.fleet = &fleet{t: t, nats: &testenv.NATS{Embedded: srv, StoreDir: storeDir}, conn: opConn, log: log, cfg: cfg, cp: p, plane: cp}
	return sf
}

func (sf *secureFleet) plant(name, value string) {
	sf.secretMu.Lock()
	defer sf.secretMu.Unlock()
	if value != "" {
		sf.secrets[name] = value
	}
}

// secureAgent is one agent that logs in with its bootstrap, then its
// session.
type secureAgent struct {
	id      string
	agent   *agent.Agent
	conn    *bus.Conn
	part    *part
	dataDir string
}

func (sf *secureFleet) startAgent(id string) *secureAgent {
	sf.t.Helper()
	boot := sf.invite(id, 1, time.Minute)
	sf.plant("invitation of "+id, boot.EnrollmentToken)
	return sf.startAgentWith(id, boot.EnrollmentToken, tempDir(sf.t), nil)
}

// startAgentWith starts an agent process with a bootstrap token and a data
// dir (which may hold a saved session), logging in as `warmfleet-agent
// --nats-auth` does: first with the bootstrap token.
func (sf *secureFleet) startAgentWith(id, token, dataDir string, sessions noderuntime.SessionHost) *secureAgent {
	sf.t.Helper()
	creds := bus.AgentCredentials(id, token, token)
	log := sf.log.Named(id)
	conn, err := bus.Connect(sf.url, "warmfleet-agent-"+id, log, append(append([]nats.Option{}, sf.tls...), creds.Options()...)...)
	if err != nil {
		sf.t.Fatal(err)
	}
	exit := 200 * time.Millisecond
	if sf.workloadTime > 0 {
		exit = sf.workloadTime
	}
	var rt noderuntime.Runtime = noopruntime.New(noopruntime.Options{ExitAfter: exit})
	if sf.runtime != nil {
		rt = sf.runtime(dataDir, log)
	}
	a, err := agent.New(agent.Config{NodeID: id, Generation: 1, EnrollmentToken: token, DataDir: dataDir,
		StopGrace: time.Second, Credentials: creds, Sessions: sessions, Capacity: schemas.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30},
		// A refused log login is tried again within a second, not ten.
		LogDialer: bus.RunLogDialer(sf.url, id, sf.tls, creds, log), LogRefusedWait: time.Second}, conn, rt, log)
	if err != nil {
		sf.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := newPart(cancel, func() error { defer conn.Close(); return a.Run(ctx) })
	sf.t.Cleanup(func() { p.stop(sf.t) })
	sf.waitNode(id, a)
	sf.plant(fmt.Sprintf("session of %s (login %d)", id, len(sf.secrets)), a.Enrollment().SessionToken)
	return &secureAgent{id: id, agent: a, conn: conn, part: p, dataDir: dataDir}
}

// dial opens a connection as creds and collects the asynchronous errors
// (permission violations) the server sends it.
func (sf *secureFleet) dial(name string, creds *bus.Credentials) (*nats.Conn, jetstream.JetStream, *asyncErrs) {
	sf.t.Helper()
	errs := &asyncErrs{}
	opts := append(append([]nats.Option{nats.Name(name), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) })}, sf.tls...), creds.Options()...)
	nc, err := nats.Connect(sf.url, opts...)
	if err != nil {
		sf.t.Fatalf("connect as %s: %v", name, err)
	}
	sf.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		sf.t.Fatal(err)
	}
	return nc, js, errs
}

// refusedLogin asserts the server refuses a login with creds.
func (sf *secureFleet) refusedLogin(what string, creds *bus.Credentials) {
	sf.t.Helper()
	nc, err := nats.Connect(sf.url, append(append([]nats.Option{nats.Name(what)}, sf.tls...), creds.Options()...)...)
	if err == nil {
		nc.Close()
		sf.t.Fatalf("%s: login accepted, want refused", what)
	}
	if !bus.IsAuthError(err) {
		sf.t.Fatalf("%s: %v, want an authorization violation", what, err)
	}
}

type asyncErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrs) add(err error) { a.mu.Lock(); a.errs = append(a.errs, err); a.mu.Unlock() }

// denied waits for the server's permission violation naming subject.
func (a *asyncErrs) denied(t *testing.T, op, subject string) {
	t.Helper()
	want := fmt.Sprintf("permissions violation for %s to %q", strings.ToLower(op), strings.ToLower(subject))
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		for _, e := range a.errs {
			if strings.Contains(strings.ToLower(e.Error()), want) {
				a.mu.Unlock()
				return
			}
		}
		a.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t.Fatalf("no %q from the server; got %v", want, a.errs)
}

// jsPublishFails asserts a JetStream publish is not stored (no ack).
func jsPublishFails(t *testing.T, js jetstream.JetStream, subject string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if ack, err := js.Publish(ctx, subject, body); err == nil {
		t.Fatalf("publish to %s was stored (stream %s seq %d)", subject, ack.Stream, ack.Sequence)
	}
}

// TestAcceptance_AgentPermissions: with auth on, each identity can do its
// own job and nothing else. An agent's credentials cannot publish another
// node's observations, read another node's commands, write KV, or enroll
// twice with one invitation; a producer cannot publish commands. Work still
// flows: a producer's Run runs on an agent and the producer reads it.
func TestAcceptance_AgentPermissions(t *testing.T) {
	sf := newSecureFleet(t)
	a := sf.startAgent("node-a")
	b := sf.startAgent("node-b")
	_ = b

	// The producer submits a Run; it runs to its end on an agent that is
	// logged in with its session, so commands and observations flow under
	// the agents' permissions.
	pnc, pjs, perrs := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	events, err := pnc.SubscribeSync(bus.RunEventsSubject(sf.producerName, ">"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(schemas.RunRequest{RequestID: "perm-1", Image: testImage, Command: []string{"true"}})
	if _, err := pjs.Publish(context.Background(), sf.producerSubmit(), body, jetstream.WithMsgID("perm-1")); err != nil {
		t.Fatalf("producer submit: %v", err)
	}
	runID := sf.producerRun("perm-1")
	if r := sf.waitPhase(runID, schemas.PhaseSucceeded, 30*time.Second); r.NodeID == "" {
		t.Fatalf("run has no node: %+v", r)
	}
	if _, err := events.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("producer follows events: %v", err)
	}
	// wf_runs holds every tenant's Runs: a producer has no KV at all (it
	// reads its Runs through its tenant's services).
	if _, err := pjs.KeyValue(context.Background(), bus.BucketRuns); err == nil {
		t.Fatal("producer opened wf_runs")
	}
	// Its output was shipped on the node's log login for that Run (the
	// node's own login may not publish logs): both streams are closed.
	sf.eventually(30*time.Second, "the run's output streams closed in WF_LOGS", func() bool {
		out, errOut := getLogEnd(sf.conn.JS, runID, bus.LogStdout)
		stderr, errErr := getLogEnd(sf.conn.JS, runID, bus.LogStderr)
		return out && stderr && errOut == nil && errErr == nil
	})

	// A producer cannot publish commands, observations, or write KV.
	jsPublishFails(t, pjs, bus.NodeCmd(a.id), []byte(`{"kind":"stop_workload"}`))
	perrs.denied(t, "publish", bus.NodeCmd(a.id))
	jsPublishFails(t, pjs, bus.NodeObs(a.id), []byte(`{}`))
	perrs.denied(t, "publish", bus.NodeObs(a.id))
	jsPublishFails(t, pjs, "$KV."+bus.BucketRuns+"."+runID, []byte(`{"phase":"succeeded"}`))
	perrs.denied(t, "publish", "$KV."+bus.BucketRuns+"."+runID)
	if _, err := pnc.Request("$JS.API.CONSUMER.CREATE."+bus.StreamCmds, []byte(`{}`), time.Second); err == nil {
		t.Fatal("producer created a consumer on WF_CMDS")
	}

	// node-a's own credentials (its session token), on a second connection.
	anc, ajs, aerrs := sf.dial("as node-a", bus.NodeCredentials(a.id, a.agent.Enrollment().SessionToken))
	jsPublishFails(t, ajs, bus.RunLogsSubject(sf.producerName, runID), []byte("forged line\n"))
	aerrs.denied(t, "publish", bus.RunLogsSubject(sf.producerName, runID))
	// Its own subjects work.
	if _, err := ajs.Consumer(context.Background(), bus.StreamCmds, bus.NodeConsumer(a.id)); err != nil {
		t.Fatalf("node-a reads its own consumer: %v", err)
	}
	// Its disk: it asks what to keep on its own subject and is answered;
	// it may not ask as node-b, nor take node-b's prunes.
	keepReq, _ := codec.Encode(codec.JSON, schemas.DiskKeepRequest{NodeID: a.id, FencingToken: a.agent.Enrollment().FencingToken})
	keepResp, err := anc.Request(bus.NodeDiskKeep(a.id), keepReq, 5*time.Second)
	if err != nil {
		t.Fatalf("node-a asks what to keep: %v", err)
	}
	var keep schemas.Reply[schemas.DiskKeep]
	if err := codec.Decode(codec.Detect(keepResp.Header, keepResp.Data), keepResp.Data, &keep); err != nil || keep.OK == nil {
		t.Fatalf("keep answer %+v (err %v)", keep, err)
	}
	if err := anc.Publish(bus.NodeDiskKeep(b.id), keepReq); err != nil {
		t.Fatal(err)
	}
	aerrs.denied(t, "publish", bus.NodeDiskKeep(b.id))
	if _, err := anc.SubscribeSync(bus.NodeDiskPrune(b.id)); err != nil {
		t.Fatal(err)
	}
	aerrs.denied(t, "subscription", bus.NodeDiskPrune(b.id))
	// The operator's prune reaches the agent under its permissions and
	// comes back with its report.
	pruneReq, _ := json.Marshal(schemas.PruneRequest{NodeID: a.id, DryRun: true})
	pruneResp, err := sf.conn.NC.Request(bus.SubjectPrune, pruneReq, 30*time.Second)
	if err != nil {
		t.Fatalf("operator prunes node-a: %v", err)
	}
	var pruned schemas.Reply[schemas.PruneReport]
	if err := json.Unmarshal(pruneResp.Data, &pruned); err != nil || pruned.OK == nil || pruned.OK.NodeID != a.id || !pruned.OK.DryRun {
		t.Fatalf("prune of node-a under auth: %s (err %v)", pruneResp.Data, err)
	}
	// Another node's observations.
	jsPublishFails(t, ajs, bus.NodeObs(b.id), []byte(`{}`))
	aerrs.denied(t, "publish", bus.NodeObs(b.id))
	if err := anc.Publish(bus.NodeHeartbeat(b.id), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	aerrs.denied(t, "publish", bus.NodeHeartbeat(b.id))
	// Another node's commands: its consumer, a pull from it, the raw
	// subject, a new consumer on WF_CMDS.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if _, err := ajs.Consumer(ctx, bus.StreamCmds, bus.NodeConsumer(b.id)); err == nil {
		t.Fatal("node-a bound node-b's command consumer")
	}
	cancel()
	aerrs.denied(t, "publish", "$JS.API.CONSUMER.INFO."+bus.StreamCmds+"."+bus.NodeConsumer(b.id))
	if _, err := anc.Request("$JS.API.CONSUMER.MSG.NEXT."+bus.StreamCmds+"."+bus.NodeConsumer(b.id), []byte(`{"batch":1,"no_wait":true}`), time.Second); err == nil {
		t.Fatal("node-a pulled from node-b's consumer")
	}
	aerrs.denied(t, "publish", "$JS.API.CONSUMER.MSG.NEXT."+bus.StreamCmds+"."+bus.NodeConsumer(b.id))
	if _, err := anc.SubscribeSync(bus.NodeCmd(b.id)); err != nil {
		t.Fatal(err)
	}
	aerrs.denied(t, "subscription", bus.NodeCmd(b.id))
	if _, err := anc.Request("$JS.API.CONSUMER.CREATE."+bus.StreamCmds, []byte(`{}`), time.Second); err == nil {
		t.Fatal("node-a created a consumer on WF_CMDS")
	}
	// KV, directly: neither its own record nor anything else.
	for _, subj := range []string{"$KV." + bus.BucketNodes + "." + a.id, "$KV." + bus.BucketRuns + "." + runID, "$KV." + bus.BucketEnroll + ".x"} {
		jsPublishFails(t, ajs, subj, []byte(`{"state":"forged"}`))
		aerrs.denied(t, "publish", subj)
	}
	if _, err := ajs.KeyValue(context.Background(), bus.BucketNodes); err == nil {
		t.Fatal("node-a opened wf_nodes")
	}
	if _, err := anc.Request("$JS.API.STREAM.PURGE.KV_"+bus.BucketNodes, nil, time.Second); err == nil {
		t.Fatal("node-a purged wf_nodes")
	}
	kv, err := sf.conn.JS.KeyValue(context.Background(), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	hist, err := kv.History(context.Background(), a.id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist {
		if strings.Contains(string(e.Value()), "forged") {
			t.Fatalf("a forged value reached wf_nodes: %s", e.Value())
		}
	}

	// One invitation enrolls once. node-c enrolls with its invitation; the
	// same invitation then neither logs in nor enrolls again.
	c := sf.startAgent("node-c")
	used := sf.secrets["invitation of node-c"]
	sf.refusedLogin("node-c's used invitation", bus.NodeCredentials(c.id, used))
	req, _ := json.Marshal(schemas.EnrollmentRequest{NodeID: c.id, Generation: 1, EnrollmentToken: used, AgentVersion: agent.Version})
	resp, err := anc.Request(bus.SubjectEnroll, req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.Enrollment]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.OK != nil || rep.Refusal == nil || rep.Refusal.Code != schemas.CodeTokenUnknown {
		t.Fatalf("second enrollment with one invitation: ok=%v refusal=%+v", rep.OK != nil, rep.Refusal)
	}
	// An invitation logs in only as the node it names, and only to enroll.
	d := sf.invite("node-d", 1, time.Minute)
	sf.refusedLogin("node-d's invitation as node-a", bus.NodeCredentials(a.id, d.EnrollmentToken))
	dnc, djs, derrs := sf.dial("node-d enrolling", bus.AgentCredentials("node-d", d.EnrollmentToken, d.EnrollmentToken))
	jsPublishFails(t, djs, bus.NodeObs("node-d"), []byte(`{}`))
	derrs.denied(t, "publish", bus.NodeObs("node-d"))
	dnc.Close()

	// Logins that are refused outright.
	sf.refusedLogin("no secret", bus.NodeCredentials(a.id, ""))
	sf.refusedLogin("unknown token", bus.NodeCredentials(a.id, randomSecret(t)))
	sf.refusedLogin("another node's session", bus.NodeCredentials(b.id, a.agent.Enrollment().SessionToken))
	sf.refusedLogin("wrong producer token", bus.ProducerCredentials(sf.producerName, randomSecret(t)))
	sf.refusedLogin("wrong operator token", bus.OperatorCredentials(randomSecret(t)))
	// Without TLS nothing connects at all.
	if nc, err := nats.Connect(sf.url, bus.OperatorCredentials(sf.secrets["operator token"]).Options()...); err == nil {
		nc.Close()
		t.Fatal("a plaintext connection was accepted")
	}
	// The real agents worked within their permissions throughout.
	for _, e := range sf.logs.All() {
		if strings.Contains(e.Message, "warmfleet-agent-") && strings.Contains(e.Message, "Violation") {
			t.Errorf("an agent hit its permissions: %s", e.Message)
		}
	}
	// The refusals were logged with their reason, naming what to do.
	if n := sf.logs.FilterMessage("NATS login refused").Len(); n < 5 {
		t.Fatalf("%d refused logins logged, want at least 5", n)
	}
}

// TestAcceptance_NoSecretsAtRest plants every kind of secret (the NATS
// service password, issuer seed, operator and producer tokens, invitations,
// sessions), runs enrollments, refusals, a session renewal and Runs, and
// then searches every KV value and key (with history), every message every
// stream still holds, every message published to a stream's subjects while
// the test ran (work queues delete what was consumed), and every log line.
func TestAcceptance_NoSecretsAtRest(t *testing.T) {
	sf := newSecureFleet(t, func(c *controlplane.Config) { c.SessionTTL = 4 * time.Second })
	// Everything published to a subject a stream stores, as it happens.
	tap := sf.tapStreams()
	ctx := context.Background()

	a := sf.startAgent("node-a")
	// A refused enrollment with a used invitation, and a refused login.
	used := sf.secrets["invitation of node-a"]
	req, _ := json.Marshal(schemas.EnrollmentRequest{NodeID: "node-a", Generation: 1, EnrollmentToken: used, AgentVersion: agent.Version})
	if resp, err := sf.conn.NC.Request(bus.SubjectEnroll, req, 5*time.Second); err != nil || strings.Contains(string(resp.Data), `"ok"`) {
		t.Fatalf("reused invitation: %v %s", err, resp.Data)
	}
	sf.refusedLogin("used invitation", bus.NodeCredentials("node-a", used))
	// A Run from the producer, with its env naming nothing secret.
	_, pjs, _ := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	for i := range 2 {
		id := fmt.Sprintf("secret-run-%d", i)
		body, _ := json.Marshal(schemas.RunRequest{RequestID: id, Image: testImage, Command: []string{"true"}, Env: map[string]string{"MODE": "test"}})
		if _, err := pjs.Publish(ctx, sf.producerSubmit(), body, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
		sf.waitPhase(sf.producerRun(id), schemas.PhaseSucceeded, 30*time.Second)
	}
	// The session renews (TTL 4s: at ~2.7s) and the agent's NATS user,
	// which expires with the session it was issued for, logs in again.
	first := a.agent.Enrollment().SessionExpires
	sf.eventually(15*time.Second, "a session renewal", func() bool { return a.agent.Enrollment().SessionExpires.After(first) })
	time.Sleep(2 * time.Second) // past the first session's expiry: a re-login under the renewed session
	sf.waitPhase(sf.submitAs(t, pjs, "secret-run-after-renewal"), schemas.PhaseSucceeded, 30*time.Second)
	sf.plant("session of node-a (renewed)", a.agent.Enrollment().SessionToken)

	// The agent restarts: its first login (the used bootstrap token) is
	// refused, it logs in with its saved session, resumes (a new session and
	// fencing token) and logs in again with the new session.
	before := a.agent.Enrollment()
	a.part.stop(t)
	a2 := sf.startAgentWith("node-a", used, a.dataDir, nil)
	if e := a2.agent.Enrollment(); !e.Duplicate || e.FencingToken <= before.FencingToken || e.SessionToken == before.SessionToken {
		t.Fatalf("restart did not resume: duplicate=%v fencing %d -> %d", e.Duplicate, before.FencingToken, e.FencingToken)
	}
	sf.refusedLogin("the session before the restart", bus.NodeCredentials("node-a", before.SessionToken))
	sf.waitPhase(sf.submitAs(t, pjs, "secret-run-after-restart"), schemas.PhaseSucceeded, 30*time.Second)

	// The agents and the producer did their work within their permissions:
	// nats-server logged no violation (this test makes none on purpose).
	for _, e := range sf.logs.All() {
		if strings.Contains(strings.ToLower(e.Message), "violation") && !strings.Contains(e.Message, "Authorization Violation") {
			t.Errorf("nats-server: %s", e.Message)
		}
	}

	// A canary proves the search finds what it looks for.
	canary := randomSecret(t)
	sf.plant("canary", canary)
	sf.log.Debug("canary", zap.String("value", canary))

	var found bool
	for _, h := range sf.searchAtRest(tap) {
		if strings.HasSuffix(h, "the canary") {
			found = true
			continue
		}
		t.Error(h)
	}
	if !found {
		t.Fatal("the search did not find the canary planted in a log line")
	}
	t.Logf("searched for %d planted secrets and a canary", len(sf.secrets)-1)
}

func (sf *secureFleet) submitAs(t *testing.T, js jetstream.JetStream, id string) string {
	t.Helper()
	body, _ := json.Marshal(schemas.RunRequest{RequestID: id, Image: testImage, Command: []string{"true"}})
	if _, err := js.Publish(context.Background(), sf.producerSubmit(), body, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	return sf.producerRun(id)
}

// producerSubmit is where the fleet's producer submits: its tenant is
// named as it is (newSecureFleet).
func (sf *secureFleet) producerSubmit() string {
	return bus.SubmitSubject(sf.producerName, sf.producerName)
}

// producerRun is the Run id the producer's request id names.
func (sf *secureFleet) producerRun(requestID string) string {
	return schemas.RunIDFor(sf.producerName, requestID)
}

// streamTap holds every message published to a subject some stream stores,
// from when it was made.
type streamTap struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

// tapStreams subscribes to every stream's subjects (KV buckets included).
func (sf *secureFleet) tapStreams() *streamTap {
	t := sf.t
	t.Helper()
	tap := &streamTap{}
	ctx := context.Background()
	for name := range sf.conn.JS.StreamNames(ctx).Name() {
		s, err := sf.conn.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, subj := range s.CachedInfo().Config.Subjects {
			if _, err := sf.conn.NC.Subscribe(subj, func(m *nats.Msg) { tap.mu.Lock(); tap.msgs = append(tap.msgs, m); tap.mu.Unlock() }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sf.conn.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return tap
}

// searchAtRest returns one line per place a planted secret was found.
func (sf *secureFleet) searchAtRest(tap *streamTap) []string {
	t := sf.t
	t.Helper()
	ctx := context.Background()
	var hits []string
	check := func(where string, data ...string) {
		for _, d := range data {
			for name, secret := range sf.secrets {
				if strings.Contains(d, secret) {
					hits = append(hits, fmt.Sprintf("%s holds the %s", where, name))
				}
			}
		}
	}
	headerText := func(h nats.Header) string { return fmt.Sprint(h) }
	// Every stream (KV buckets are streams KV_<bucket>), every message it
	// holds, by sequence: subject (a KV key), headers and body.
	streams := 0
	for name := range sf.conn.JS.StreamNames(ctx).Name() {
		streams++
		s, err := sf.conn.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			check(fmt.Sprintf("stream %s seq %d (%s)", name, seq, m.Subject), m.Subject, headerText(m.Header), string(m.Data))
		}
	}
	if streams < 6 {
		t.Fatalf("found %d streams; the search is not looking where it should", streams)
	}
	// Every KV value through the KV API too, decoded as stored.
	buckets := 0
	for name := range sf.conn.JS.KeyValueStoreNames(ctx).Name() {
		buckets++
		kv, err := sf.conn.JS.KeyValue(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			hist, err := kv.History(ctx, k)
			if err != nil {
				continue
			}
			for _, e := range hist {
				check(fmt.Sprintf("KV %s key %s rev %d", name, k, e.Revision()), k, string(e.Value()))
			}
		}
	}
	if buckets < 4 {
		t.Fatalf("found %d KV buckets; the search is not looking where it should", buckets)
	}
	// Everything published to a stream's subjects while the test ran.
	tap.mu.Lock()
	for i, m := range tap.msgs {
		check(fmt.Sprintf("message %d published to %s", i, m.Subject), m.Subject, headerText(m.Header), string(m.Data))
	}
	n := len(tap.msgs)
	tap.mu.Unlock()
	if n == 0 {
		t.Fatal("no stream message seen while the test ran")
	}
	// Every log line: message, logger name and every field.
	entries := sf.logs.All()
	for i, e := range entries {
		b, _ := json.Marshal(e.ContextMap())
		check(fmt.Sprintf("log line %d (%s: %q)", i, e.LoggerName, e.Message), e.Message, string(b), fmt.Sprint(e.ContextMap()))
	}
	if len(entries) == 0 {
		t.Fatal("no log lines captured")
	}
	t.Logf("searched %d streams, %d buckets, %d published stream messages, %d log lines", streams, buckets, n, len(entries))
	return hits
}

// natsLogger sends nats-server's log to zap.
type natsLogger struct{ l *zap.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Info(fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }

// TestAcceptance_SessionHostUnderAuth: an agent hosting resident sessions
// does its whole job under its node permissions (answers the control
// plane's session commands, asks the residency service, reads the session's
// inbox), and a producer feeds its own tenant's session inbox, not
// another tenant's.
// startSessionHostAgent starts an agent enrolled as nodeID by a fresh
// invitation, hosting sessions whose work the returned ledger records.
func (sf *secureFleet) startSessionHostAgent(nodeID string) *ledger {
	t := sf.t
	l := newLedger(t)
	dataDir := tempDir(t)
	ws := filepath.Join(dataDir, "sessions")
	host, err := nodehost.New(nodehost.Options{
		Target:   residency.RuntimeTarget{Image: noopImage, ManifestDigest: noopDigest, CompatibilityID: sessCompat, StopGrace: 100 * time.Millisecond},
		Capacity: 4, WorkspaceRoot: ws, Handler: l.handler(nodeID, ws, nodehost.AckWhenWritten), Hooks: l.hooks(nodeID), RequestTimeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	sf.startAgentWith(nodeID, sf.invite(nodeID, 1, time.Minute).EnrollmentToken, dataDir, host)
	return l
}

func TestAcceptance_SessionHostUnderAuth(t *testing.T) {
	sf := newSecureFleet(t, func(c *controlplane.Config) {
		c.Sessions = sessions.Config{LeaseTTL: 3 * time.Second, InboxAckWait: 5 * time.Second,
			AttachTimeout: 30 * time.Second, DrainTimeout: 20 * time.Second}
	})
	l := sf.startSessionHostAgent("node-s")

	key := residency.Key{Tenant: sf.producerName, Session: "chat-1"}
	// The host starts serving just after the agent enrolls.
	var rep schemas.SessionReply
	sf.eventually(20*time.Second, "the session to attach on node-s", func() bool {
		rep = sf.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Mode: residency.ModeCreate, Node: "node-s"})
		return rep.Error == nil
	})
	if r := rep.Residency; r == nil || r.Host != "node-s" || !r.Attached {
		t.Fatalf("attach: %+v", r)
	}
	_, pjs, perrs := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	for i := range 3 {
		id := fmt.Sprintf("work-%d", i)
		if _, err := pjs.Publish(context.Background(), key.InboxSubject(), []byte(`{"work":"`+id+`"}`), jetstream.WithMsgID(id)); err != nil {
			t.Fatalf("producer feeds its session: %v", err)
		}
	}
	sf.eventually(20*time.Second, "the session host to handle the producer's work", func() bool { return l.count() >= 3 })
	other := residency.Key{Tenant: "someone-else", Session: "chat-1"}.InboxSubject()
	jsPublishFails(t, pjs, other, []byte(`{}`))
	perrs.denied(t, "publish", other)
	if rep := sf.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("release: %v", rep.Error)
	}
	for _, e := range sf.logs.All() {
		if strings.Contains(e.Message, "warmfleet-agent-") && strings.Contains(e.Message, "Violation") {
			t.Errorf("the session host hit its permissions: %s", e.Message)
		}
	}
}

// getLogEnd reports whether WF_LOGS holds the closing message of the first
// attempt's stream of runID (whichever tenant's: Run ids differ across tenants).
func getLogEnd(js jetstream.JetStream, runID, stream string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, bus.StreamLogs, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.RunLogsSubject("*", runID)}})
	if err != nil {
		return false, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err
	}
	for left := info.NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			return false, err
		}
		h := m.Headers()
		if h.Get(bus.HeaderLogStream) == stream && h.Get(bus.HeaderLogEnd) != "" && h.Get(bus.HeaderLogAttempt) == schemas.WorkloadID(runID, 1) {
			return true, nil
		}
	}
	return false, nil
}

// has reports whether an error holding s (lower case) was collected.
func (a *asyncErrs) has(s string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		if strings.Contains(strings.ToLower(e.Error()), s) {
			return true
		}
	}
	return false
}
