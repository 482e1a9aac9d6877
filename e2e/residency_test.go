package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_ResidencyFailover: a session resident on node A; A stops
// (its process is gone: nothing is released, its lease lapses); node B
// attaches under a higher epoch; A's late route publishes, tombstones and
// checkpoints are refused by the control plane; every inbox message
// published throughout is processed exactly once, by whichever host held the
// grant, and no two hosts ever consumed the inbox at once.
func TestAcceptance_ResidencyFailover(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", ledger: l})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "chat-1"}

	r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Mode: residency.ModeCreate, Node: a.id})
	if r.Host != a.id || r.Epoch != 1 || !r.Attached {
		t.Fatalf("first attach: %+v, want node-a at epoch 1", r)
	}
	if st, ok := f.sessionRecord(key); !ok || st.Namespace != residency.NamespaceFor(key) || st.CompatibilityID != sessCompat {
		t.Fatalf("created session's durable record: %+v (found %v)", st, ok)
	}

	// Producers publish throughout: before, during and after the failover.
	const total = 30
	ids := make([]string, 0, total)
	published := make(chan struct{})
	pubCtx, stopPub := context.WithCancel(context.Background())
	defer stopPub()
	go func() {
		defer close(published)
		for i := range total {
			id := fmt.Sprintf("work-%02d", i)
			ids = append(ids, id)
			f.publishWork(key, id)
			select {
			case <-pubCtx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	f.eventually(15*time.Second, "node-a to process inbox work", func() bool { return l.count() >= 3 })

	// A goes away without releasing anything.
	a.part.stop(t)
	stoppedAt := time.Now()

	// B cannot take the session while A's lease is live; once it expires B
	// attaches (resume) under epoch 2. Placement tries the previous host
	// first; node-a no longer answers, so B it is.
	rb := f.attachWhenLeaseFree(key, 20*time.Second, "node-b to attach after A's lease expired")
	if rb.Host != b.id || rb.Epoch != 2 {
		t.Fatalf("failover attach: %+v, want node-b at epoch 2", rb)
	}
	t.Logf("node-b resident %s after node-a stopped", time.Since(stoppedAt).Round(time.Millisecond))

	// A's late writes, through the same service its agent used, under its
	// identity: all refused, and the route stays B's.
	late := &residency.Remote{NC: f.conn.NC, NodeID: a.id, Timeout: 5 * time.Second}
	ctx := context.Background()
	err := late.PublishResidency(ctx, residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: a.id, Epoch: 1,
		State: residency.StateResident, Accepting: true, ObservedAt: time.Now()})
	if !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("late publish under epoch 1: %v, want ErrEpochSuperseded", err)
	}
	if err := late.TombstoneResidency(ctx, key, a.id, 1); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("late tombstone under epoch 1: %v, want ErrEpochSuperseded", err)
	}
	if err := late.CommitCheckpoint(ctx, residency.Checkpoint{Key: residency.WireKey(key), Host: a.id, Epoch: 1, Sequence: 99,
		CompatibilityID: sessCompat, Namespace: residency.NamespaceFor(key)}); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("late checkpoint under epoch 1: %v, want ErrEpochSuperseded", err)
	}
	// Nor may A write as B: the subject is the caller's identity.
	err = late.PublishResidency(ctx, residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: b.id, Epoch: 2,
		State: residency.StateResident, ObservedAt: time.Now()})
	if !errors.Is(err, residency.ErrForbidden) {
		t.Errorf("node-a publishing node-b's route: %v, want ErrForbidden", err)
	}
	if o, ok := f.route(key); !ok || o.Host != b.id || o.Epoch != 2 || o.State != residency.StateResident {
		t.Fatalf("route after A's late writes: %+v", o)
	}

	<-published
	f.eventually(30*time.Second, "every message processed", func() bool { return l.count() == total })
	time.Sleep(500 * time.Millisecond) // a duplicate would show up now
	byA, byB := 0, 0
	for _, id := range ids {
		h := l.handled(id)
		if len(h) != 1 {
			t.Errorf("message %s handled %d times: %v", id, len(h), h)
			continue
		}
		switch h[0] {
		case "node-a@1":
			byA++
		case "node-b@2":
			byB++
		default:
			t.Errorf("message %s handled by %s, want node-a@1 or node-b@2", id, h[0])
		}
		// Delivered into the resident host's workspace, where the session's
		// runtime reads it (node-a's went with its process).
		if h[0] == "node-b@2" {
			if _, err := os.Stat(filepath.Join(b.ws, key.Tenant, key.Session, "inbox", id)); err != nil {
				t.Errorf("message %s not in node-b's workspace: %v", id, err)
			}
		}
	}
	if byA == 0 || byB == 0 {
		t.Errorf("processed by A %d, by B %d: the failover happened outside the stream of work", byA, byB)
	}
	l.checkNoOverlap()
}

// TestAcceptance_WarmReleaseAndResume, on real containerd: a session's
// runtime is a container; once its inbox is durably idle for the warm TTL
// the host releases it (stop consuming, checkpoint, remove the container,
// tombstone, drop the lease). Work published while nothing is resident waits
// in WF_INBOX, and a resume on another node runs it under the next epoch,
// from the checkpoint the release committed.
func TestAcceptance_WarmReleaseAndResume(t *testing.T) {
	w := newWorld(t)
	f := sessionFleet(t)
	l := newLedger(t)
	target := residency.RuntimeTarget{Image: w.image.Reference, ManifestDigest: w.image.ManifestDigest,
		Command:         []string{"sh", "-c", `echo "session $WF_SESSION up at epoch $WF_LEASE_EPOCH"; exec sleep 3600`},
		CompatibilityID: sessCompat, StopGrace: 100 * time.Millisecond}
	rtA := f.containerdRuntime(w, "node-a")
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: rtA, target: target, warmTTL: 2 * time.Second, ledger: l})
	key := residency.Key{Tenant: "acme", Session: "warm-1"}

	r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
	if r.Epoch != 1 || r.Host != a.id || r.Workload != residency.WorkloadID(key, 1) {
		t.Fatalf("attach: %+v", r)
	}
	ctx := context.Background()
	if st, err := rtA.Inspect(ctx, r.Workload); err != nil || st.State != noderuntime.WorkloadRunning {
		t.Fatalf("session container %s: %+v, %v; want running", r.Workload, st, err)
	}
	// Re-attaching a resident session takes nothing.
	if again := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id}); again.Attached || again.Epoch != 1 {
		t.Fatalf("re-attach: %+v, want Attached=false at epoch 1", again)
	}
	f.publishWork(key, "w-1")
	f.publishWork(key, "w-2")
	f.eventually(15*time.Second, "work handled", func() bool { return l.count() == 2 })
	if _, err := os.Stat(filepath.Join(a.ws, key.Tenant, key.Session, "inbox", "w-2")); err != nil {
		t.Fatalf("work not delivered into the session workspace: %v", err)
	}

	// Durably idle → warm release after the TTL.
	f.eventually(20*time.Second, "warm release tombstones the route", func() bool {
		o, ok := f.route(key)
		return ok && o.State == residency.StateExpired && o.Epoch == 1
	})
	// The release drops the lease after the tombstone, and its local state
	// last.
	var lr residency.LeaseRecord
	f.eventually(20*time.Second, "warm release drops the lease", func() bool {
		var ok bool
		lr, ok = f.leaseRecord(key)
		return ok && lr.Released
	})
	if lr.Epoch != 1 {
		t.Errorf("lease after warm release: %+v, want released at epoch 1", lr)
	}
	if st, ok := f.sessionRecord(key); !ok || st.CheckpointSequence != 1 || st.Epoch != 1 {
		t.Errorf("durable state after warm release: %+v, want checkpoint 1 at epoch 1", st)
	}
	f.eventually(10*time.Second, "session container removed", func() bool {
		_, err := rtA.Inspect(ctx, r.Workload)
		return errors.Is(err, noderuntime.ErrWorkloadNotFound)
	})
	f.eventually(10*time.Second, "node-a to hold nothing after warm release", func() bool { return len(a.host.Residencies()) == 0 })

	// Work arriving while the session is resident nowhere waits.
	f.publishWork(key, "w-3")
	time.Sleep(time.Second)
	if h := l.handled("w-3"); len(h) != 0 {
		t.Fatalf("w-3 handled while nothing was resident: %v", h)
	}

	// Resume on a second node, a real containerd too.
	rtB := f.containerdRuntime(w, "node-b")
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", rt: rtB, target: target, warmTTL: time.Minute, ledger: l})
	rb := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: b.id})
	if rb.Epoch != 2 || rb.Host != b.id || !rb.Attached {
		t.Fatalf("resume: %+v, want node-b at epoch 2", rb)
	}
	if st, err := rtB.Inspect(ctx, residency.WorkloadID(key, 2)); err != nil || st.State != noderuntime.WorkloadRunning {
		t.Fatalf("resumed container: %+v, %v", st, err)
	}
	f.eventually(15*time.Second, "w-3 handled by the resumed session", func() bool { return len(l.handled("w-3")) == 1 })
	if h := l.handled("w-3"); h[0] != "node-b@2" {
		t.Errorf("w-3 handled by %v, want node-b@2", h)
	}
	for _, id := range []string{"w-1", "w-2"} {
		if h := l.handled(id); len(h) != 1 || h[0] != "node-a@1" {
			t.Errorf("%s handled %v, want once by node-a@1", id, h)
		}
	}
	// Explicit release through the control plane, as `warmfleet session
	// release` does: the container goes and the route is tombstoned at 2.
	if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("release: %v", rep.Error)
	}
	if o, _ := f.route(key); o.State != residency.StateExpired || o.Epoch != 2 {
		t.Errorf("route after release: %+v", o)
	}
	if _, err := rtB.Inspect(ctx, residency.WorkloadID(key, 2)); !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
		t.Errorf("container after release: %v, want not found", err)
	}
	if st, _ := f.sessionRecord(key); st.CheckpointSequence != 2 || st.Epoch != 2 {
		t.Errorf("durable state after release: %+v, want checkpoint 2 at epoch 2", st)
	}
	l.checkNoOverlap()

	// Each epoch's runtime printed its line; the session's output, on its
	// own subject, holds both, each stream closed once its workload went.
	f.eventually(15*time.Second, "both epochs' output stored and closed", func() bool {
		got := f.storedOn(bus.SessionLogsSubject(key.Tenant, key.Session))
		for epoch := 1; epoch <= 2; epoch++ {
			k := [2]string{residency.WorkloadID(key, residency.ResidencyEpoch(epoch)), bus.LogStdout}
			if string(got.bytes[k]) != fmt.Sprintf("session %s up at epoch %d\n", key.Session, epoch) {
				return false
			}
			if _, ok := got.ended[k]; !ok {
				return false
			}
		}
		return got.duplicates == 0 && got.gaps == 0
	})
}

// stuckRuntime refuses to stop one session's workloads, so its release
// aborts and the drain must report it.
type stuckRuntime struct {
	*noopruntime.Runtime
	session string
}

func (r stuckRuntime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if strings.Contains(id, "-"+r.session+"-") {
		return errors.New("stuck: the runtime will not stop this workload")
	}
	return r.Runtime.Stop(ctx, id, grace)
}

// TestAcceptance_DrainReleasesAll: `warmfleet node drain` (the
// wf.admin.node.drain request) stops new admissions on the node at once,
// releases every resident session gracefully, and reports the one whose
// runtime refused to stop; that one stays resident and no longer advertises
// accepting.
func TestAcceptance_DrainReleasesAll(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	rt := stuckRuntime{Runtime: noopruntime.New(noopruntime.Options{}), session: "stuck"}
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: rt, ledger: l})
	names := []string{"s1", "s2", "s3", "stuck"}
	for _, s := range names {
		r := f.attachSession(schemas.SessionRequest{Tenant: "acme", Session: s, Node: a.id})
		if r.Host != a.id {
			t.Fatalf("attach %s: %+v", s, r)
		}
	}
	f.publishWork(residency.Key{Tenant: "acme", Session: "s1"}, "d-1")
	f.eventually(10*time.Second, "work handled", func() bool { return l.count() == 1 })

	b, err := json.Marshal(schemas.AdminRequest{ID: a.id})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.conn.NC.Request(bus.SubjectDrain, b, 40*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.NodeDrainReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.OK == nil || rep.OK.State != schemas.NodeDraining || rep.Sessions == nil {
		t.Fatalf("drain reply: %+v", rep)
	}
	v := rep.Sessions
	if got := strings.Join(sortedKeys(v.Released), ","); got != "acme.s1,acme.s2,acme.s3" {
		t.Errorf("released %s, want acme.s1,acme.s2,acme.s3", got)
	}
	if len(v.Failures) != 1 || v.Failures[0].Key.Session != "stuck" || !strings.Contains(v.Failures[0].Reason, "stuck") {
		t.Fatalf("drain failures: %+v, want exactly acme.stuck with the runtime's reason", v.Failures)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		key := residency.Key{Tenant: "acme", Session: s}
		if o, _ := f.route(key); o.State != residency.StateExpired {
			t.Errorf("%s route after drain: %+v, want expired tombstone", key, o)
		}
		if lr, _ := f.leaseRecord(key); !lr.Released {
			t.Errorf("%s lease after drain: %+v, want released", key, lr)
		}
		if st, _ := f.sessionRecord(key); st.CheckpointSequence != 1 {
			t.Errorf("%s checkpoint after drain: %+v", key, st)
		}
	}
	stuck := residency.Key{Tenant: "acme", Session: "stuck"}
	if o, _ := f.route(stuck); o.State != residency.StateResident || o.Accepting || o.Host != a.id {
		t.Errorf("unreleased session's route: %+v, want resident on node-a, not accepting", o)
	}

	// New admissions are refused at once: by placement (the node is
	// draining) and by the node's own ledger if asked directly.
	if rep := f.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: "acme", Session: "late", Node: a.id}); rep.Error == nil {
		t.Errorf("attach on a draining node placed: %+v", rep.Residency)
	}
	direct := f.askHost(a, schemas.SessionAttach, schemas.SessionCommand{Tenant: "acme", Session: "late", Mode: residency.ModeCreate, Actor: "test"})
	if direct.Error == nil || direct.Error.Code != residency.CodeDraining {
		t.Errorf("direct attach on draining host: %+v, want draining", direct.Error)
	}
	if lr, ok := f.leaseRecord(residency.Key{Tenant: "acme", Session: "late"}); ok {
		t.Errorf("a refused attach took a lease: %+v", lr)
	}
	list := f.askHost(a, schemas.SessionList, schemas.SessionCommand{})
	if len(list.Residencies) != 1 || list.Residencies[0].Session != "stuck" {
		t.Errorf("node-a holds %+v after drain, want only acme.stuck", list.Residencies)
	}
	// A command stamped with another session's fencing token is refused.
	stale := schemas.SessionCommand{FencingToken: a.agent.Enrollment().FencingToken + 7}
	bs, _ := json.Marshal(stale)
	if resp, err := f.conn.NC.Request(bus.NodeSessions(a.id, string(schemas.SessionList)), bs, 5*time.Second); err != nil {
		t.Fatal(err)
	} else {
		var r schemas.SessionReply
		_ = json.Unmarshal(resp.Data, &r)
		if r.Error == nil || r.Error.Code != residency.CodeStaleNode {
			t.Errorf("stale-token command: %+v, want stale_fencing_token", r)
		}
	}
	l.checkNoOverlap()
}
