package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_HostileNode: under auth, node A, logged in as itself,
// tries to act on what node B holds: a failed receipt and an exit report for
// B's attempt, every residency write on B's session under a higher epoch, a
// lease on B's session and on one placed nowhere, credentials for B's
// booking, and, with a fresh unredeemed invitation for B, a subscription to
// B's inboxes. Each is refused with a code (the subscription with a
// permissions violation), and B's Run ends as its workload did while B's
// session keeps its lease, route and state and goes on taking work.
func TestAcceptance_HostileNode(t *testing.T) {
	sf := newSecureFleet(t, func(c *controlplane.Config) {
		c.Sessions = sessions.Config{LeaseTTL: 3 * time.Second, InboxAckWait: 5 * time.Second, AttachTimeout: 30 * time.Second, DrainTimeout: 20 * time.Second}
	})
	sf.workloadTime = 20 * time.Second // B's Run runs through the attack

	// Node B: a real agent hosting a session and running a Run.
	l := sf.startSessionHostAgent("node-b")
	key := residency.Key{Tenant: sf.producerName, Session: "victim-1"}
	sf.eventually(20*time.Second, "B's session to attach on node-b", func() bool {
		rep := sf.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Mode: residency.ModeCreate, Node: "node-b"})
		return rep.Error == nil
	})
	runID := sf.submit(schemas.RunRequest{RequestID: "victim-run", Image: testImage, Command: []string{"true"}})
	victim := sf.waitPhase(runID, schemas.PhaseRunning, 30*time.Second)
	if victim.NodeID != "node-b" {
		t.Fatalf("B's Run runs on %q", victim.NodeID)
	}
	before := sf.sessionState(key)

	// Node A: enrolled, then acting on a connection with its own session.
	a := sf.startAgent("node-a")
	enr := a.agent.Enrollment()
	anc, ajs, aerrs := sf.dial("hostile node-a", bus.NodeCredentials(a.id, enr.SessionToken))

	t.Run("receipt and report for B's attempt", func(t *testing.T) {
		refused := sf.plane.Metrics().RefusedObservations
		seven := 7
		for _, o := range []schemas.Observation{
			{NodeID: a.id, FencingToken: enr.FencingToken, Generation: enr.Generation, Kind: schemas.ObsReceipt, Receipt: &schemas.OperationReceipt{
				OperationID: victim.AttemptID + "-launch", Kind: schemas.CmdLaunchWorkload, RunID: runID, AttemptID: victim.AttemptID,
				AcceptedAt: time.Now(), Outcome: schemas.OutcomeFailed, Code: schemas.CodeLaunchFailed, Message: "forged by node-a"}},
			{NodeID: a.id, FencingToken: enr.FencingToken, Generation: enr.Generation, Kind: schemas.ObsWorkload, Workload: &schemas.WorkloadObservation{
				RunID: runID, AttemptID: victim.AttemptID, Phase: schemas.WorkloadExited, ExitCode: &seven, ObservedAt: time.Now()}},
		} {
			m := &nats.Msg{Subject: bus.NodeObs(a.id), Data: encodeJSON(t, o), Header: nats.Header{codec.ContentTypeHeader: []string{codec.ContentTypeJSON}}}
			if _, err := ajs.PublishMsg(context.Background(), m); err != nil {
				t.Fatalf("node-a publishes on its own subject: %v", err)
			}
		}
		sf.eventually(20*time.Second, "both refused", func() bool { return sf.plane.Metrics().RefusedObservations >= refused+2 })
		coded := 0
		for _, e := range sf.logs.FilterMessage("observation refused").All() {
			if e.ContextMap()["code"] == string(schemas.CodeNotBookedHere) && e.ContextMap()["node_id"] == a.id {
				coded++
			}
		}
		if coded < 2 {
			t.Errorf("%d refusals logged with code %s, want 2", coded, schemas.CodeNotBookedHere)
		}
	})

	t.Run("residency writes on B's session", func(t *testing.T) {
		ra := &residency.Remote{NC: anc, NodeID: a.id, Timeout: 5 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		const high = residency.ResidencyEpoch(1 << 62)
		forged := residency.LeaseGrant{Key: residency.WireKey(key), Holder: a.id, Epoch: high, Revision: 1, TTL: 3 * time.Second,
			GrantedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), Token: "guessed"}
		for _, c := range []struct {
			what string
			err  error
			want residency.Code
		}{
			{"checkpoint", ra.CommitCheckpoint(ctx, residency.Checkpoint{Key: residency.WireKey(key), Host: a.id, Epoch: high, Sequence: 99,
				Namespace: residency.NamespaceFor(key), CompatibilityID: sessCompat}), residency.CodeNotLeaseHolder},
			{"route publish", ra.PublishResidency(ctx, residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: a.id, Epoch: high,
				State: residency.StateResident, Accepting: true, ObservedAt: time.Now()}), residency.CodeNotLeaseHolder},
			{"route tombstone", ra.TombstoneResidency(ctx, key, a.id, high), residency.CodeNotLeaseHolder},
			{"lease renew", second(ra.RenewSessionLease(ctx, forged)), residency.CodeNotLeaseHolder},
			{"lease release", ra.ReleaseSessionLease(ctx, forged), residency.CodeNotLeaseHolder},
			{"lease acquire of B's session", second(ra.AcquireSessionLease(ctx, key, a.id)), residency.CodeNotPlaced},
			{"lease acquire of a session placed nowhere", second(ra.AcquireSessionLease(ctx, residency.Key{Tenant: key.Tenant, Session: "nowhere-1"}, a.id)), residency.CodeNotPlaced},
		} {
			var we *residency.WireError
			if !errors.As(c.err, &we) || we.Code != c.want {
				t.Errorf("%s: %v, want code %s", c.what, c.err, c.want)
			}
		}
	})

	t.Run("credentials for B's booking", func(t *testing.T) {
		reg := askJSON[schemas.Reply[schemas.RegistryCredential]](t, anc, bus.NodeRegistryCredentials(a.id),
			schemas.RegistryCredentialRequest{NodeID: a.id, FencingToken: enr.FencingToken, Reference: testImage, RunID: runID})
		if reg.OK != nil || reg.Refusal == nil || reg.Refusal.Code != schemas.CodeImageNotWanted {
			t.Errorf("registry credential for B's Run: ok %v, refusal %+v; want %s", reg.OK != nil, reg.Refusal, schemas.CodeImageNotWanted)
		}
		art := askJSON[schemas.Reply[schemas.ArtifactCredential]](t, anc, bus.NodeArtifactCredentials(a.id),
			schemas.ArtifactCredentialRequest{NodeID: a.id, FencingToken: enr.FencingToken, Digest: "sha256:" + strings.Repeat("ab", 32), RunID: runID})
		if art.OK != nil || art.Refusal == nil || art.Refusal.Code != schemas.CodeArtifactNotWanted {
			t.Errorf("artifact credential for B's Run: ok %v, refusal %+v; want %s", art.OK != nil, art.Refusal, schemas.CodeArtifactNotWanted)
		}
		// Nor may it ask in B's name.
		if err := anc.Publish(bus.NodeRegistryCredentials("node-b"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		aerrs.denied(t, "publish", bus.NodeRegistryCredentials("node-b"))
	})

	t.Run("an enrolling identity subscribing B's inboxes", func(t *testing.T) {
		inv := sf.invite("node-b", 2, time.Minute).EnrollmentToken
		enc, _, eerrs := sf.dial("enrolling as node-b", bus.AgentCredentials("node-b", inv, inv))
		for _, theirs := range []string{bus.NodeInboxPrefix("node-b") + ".>", "_WF_INBOX.enroll.node-b.>"} {
			if _, err := enc.SubscribeSync(theirs); err != nil {
				t.Fatal(err)
			}
			eerrs.denied(t, "subscription", theirs)
		}
		enc.Close()
	})

	// B goes on untouched: its Run ends as its workload did, on its first
	// attempt; its session keeps its lease, route and state, and takes work.
	done := sf.waitPhase(runID, schemas.PhaseSucceeded, 60*time.Second)
	if done.NodeID != "node-b" || done.Attempt != victim.Attempt || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Errorf("B's Run ended on %s, attempt %d, exit %v; want node-b, attempt %d, exit 0", done.NodeID, done.Attempt, done.ExitCode, victim.Attempt)
	}
	after := sf.sessionState(key)
	if after.lease.Holder != "node-b" || after.lease.Epoch != before.lease.Epoch || after.lease.Released ||
		after.route.Host != "node-b" || after.route.Epoch != before.route.Epoch || after.route.State != residency.StateResident ||
		after.sessionRev != before.sessionRev {
		t.Errorf("B's session changed: before %+v, after %+v", before, after)
	}
	_, pjs, _ := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	if _, err := pjs.Publish(context.Background(), key.InboxSubject(), []byte(`{"work":"after"}`), jetstream.WithMsgID("after")); err != nil {
		t.Fatal(err)
	}
	sf.eventually(20*time.Second, "B's session to take work after the attack", func() bool { return l.count() >= 1 })
	for _, e := range sf.logs.All() {
		if strings.Contains(e.Message, "warmfleet-agent-") && strings.Contains(e.Message, "Violation") {
			t.Errorf("a real agent hit its permissions: %s", e.Message)
		}
	}
}

// sessionSnapshot is what the control plane holds of a session.
type sessionSnapshot struct {
	lease      schemas.SessionLeaseRecord
	route      schemas.ResidencyObservation
	sessionRev uint64 // wf_sessions revision; 0 when it holds no record
}

func (sf *secureFleet) sessionState(key residency.Key) sessionSnapshot {
	sf.t.Helper()
	ctx := context.Background()
	var s sessionSnapshot
	for bucket, v := range map[string]any{bus.BucketLeases: &s.lease, bus.BucketResidency: &s.route} {
		kv, err := sf.conn.JS.KeyValue(ctx, bucket)
		if err != nil {
			sf.t.Fatal(err)
		}
		if _, err := bus.GetJSON(ctx, kv, key.String(), v); err != nil {
			sf.t.Fatalf("%s %s: %v", bucket, key, err)
		}
	}
	kv, err := sf.conn.JS.KeyValue(ctx, bus.BucketSessions)
	if err != nil {
		sf.t.Fatal(err)
	}
	if e, err := kv.Get(ctx, key.String()); err == nil {
		s.sessionRev = e.Revision()
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		sf.t.Fatal(err)
	}
	return s
}

func second[T any](_ T, err error) error { return err }

func encodeJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// askJSON sends v as a JSON request on subject and decodes the reply.
func askJSON[R any](t *testing.T, nc *nats.Conn, subject string, v any) R {
	t.Helper()
	m := &nats.Msg{Subject: subject, Data: encodeJSON(t, v), Header: nats.Header{codec.ContentTypeHeader: []string{codec.ContentTypeJSON}}}
	resp, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	var r R
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &r); err != nil {
		t.Fatalf("%s reply: %v", subject, err)
	}
	return r
}
