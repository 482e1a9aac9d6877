package residency

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

// serviceEnv is the control plane's residency Service on an embedded NATS,
// and a Remote client for each node id asked for.
type serviceEnv struct {
	env *busEnv
	cp  *controlPlane
	st  *KVSessions
}

func newServiceEnv(t *testing.T, ttl time.Duration) *serviceEnv {
	t.Helper()
	env := newBus(t)
	cp := newControlPlane(t, env, SystemClock{}, ttl, 5*time.Second)
	st, err := NewKVSessions(testCtx(t), KVSessionsOptions{JS: env.js})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := NewService(Services{Leases: cp.leases, Locations: cp.locations, Sessions: st}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := svc.Serve(ctx, env.conn.NC, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); cancel() })
	return &serviceEnv{env: env, cp: cp, st: st}
}

func (s *serviceEnv) remote(node string) *Remote {
	return &Remote{NC: s.env.conn.NC, NodeID: node, Timeout: 5 * time.Second}
}

// The wire keeps typed errors: a caller matches them with errors.Is exactly
// as it would in process, and the subject's node id is the only identity.
func TestRemote_TypedErrorsAndIdentity(t *testing.T) {
	s := newServiceEnv(t, 2*time.Second)
	ctx := testCtx(t)
	a, b := s.remote("host-a"), s.remote("host-b")
	key := Key{Tenant: tenant, Session: "wire-1"}

	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil || g.Epoch != 1 || g.Holder != "host-a" {
		t.Fatalf("acquire: %+v, %v", g, err)
	}
	if _, err := b.AcquireSessionLease(ctx, key, "host-b"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("second holder: %v, want ErrLeaseHeld", err)
	}
	if _, err := b.RenewSessionLease(ctx, g); !errors.Is(err, ErrForbidden) {
		t.Fatalf("host-b renewing host-a's grant: %v, want ErrForbidden", err)
	}
	if _, err := a.AcquireSessionLease(ctx, key, "host-b"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("host-a acquiring for host-b: %v, want ErrForbidden", err)
	}
	ng, err := a.RenewSessionLease(ctx, g)
	if err != nil || ng.Revision <= g.Revision {
		t.Fatalf("renew: %+v, %v", ng, err)
	}
	// The grant at its older revision, as after a renewal whose answer was
	// lost on the wire: the token still names it, so it renews.
	if ng2, err := a.RenewSessionLease(ctx, g); err != nil || ng2.Revision <= ng.Revision {
		t.Fatalf("renew at a stale revision of the same grant: %+v, %v", ng2, err)
	} else {
		ng = ng2
	}
	obs := Observation{Tenant: key.Tenant, Session: key.Session, Host: "host-a", Epoch: 1, State: StateResident, Accepting: true, ObservedAt: time.Now()}
	if err := a.PublishResidency(ctx, obs); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := b.TombstoneResidency(ctx, key, "host-b", 1); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("host-b tombstoning host-a's epoch: %v, want ErrEpochSuperseded", err)
	}
	if err := a.ReleaseSessionLease(ctx, ng); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := a.TombstoneResidency(ctx, key, "host-a", 1); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if err := a.PublishResidency(ctx, obs); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("publish over own tombstone: %v, want ErrTombstoned", err)
	}
	// host-b takes over at epoch 2; host-a's epoch-1 writes are refused.
	g2, err := b.AcquireSessionLease(ctx, key, "host-b")
	if err != nil || g2.Epoch != 2 {
		t.Fatalf("successor: %+v, %v", g2, err)
	}
	if err := a.PublishResidency(ctx, obs); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("late publish: %v, want ErrEpochSuperseded", err)
	}
	// Nobody answering is a transport failure, never a lost lease.
	none := &Remote{NC: s.env.conn.NC, NodeID: "host-a", Timeout: 300 * time.Millisecond}
	s.env.conn.NC.Close()
	if _, err := none.RenewSessionLease(context.Background(), g2); errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrServiceUnavailable) {
		t.Fatalf("renew with no service: %v, want ErrServiceUnavailable and not ErrLeaseLost", err)
	}
}

// wf_sessions: a create is allowed only when no earlier residency ran, a
// checkpoint under a superseded epoch is refused, and what a release commits
// is what the next resume loads.
func TestKVSessions_JournalStateAndFence(t *testing.T) {
	s := newServiceEnv(t, time.Second)
	ctx := testCtx(t)
	a := s.remote("host-a")
	key := Key{Tenant: tenant, Session: "durable-1"}

	st, err := a.LoadSessionState(ctx, key)
	if err != nil || st.Exists || st.RuntimeJournal != JournalEmpty || st.Namespace != NamespaceFor(key) {
		t.Fatalf("fresh session: %+v, %v", st, err)
	}
	g, err := a.AcquireSessionLease(ctx, key, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := a.LoadSessionState(ctx, key); st.RuntimeJournal != JournalEmpty {
		t.Fatalf("under the first grant: %+v, want journal empty", st)
	}
	if err := a.ReleaseSessionLease(ctx, g); err != nil {
		t.Fatal(err)
	}
	// Epoch 1 ran and recorded nothing: a later create fails closed.
	if _, err := a.AcquireSessionLease(ctx, key, "host-a"); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.LoadSessionState(ctx, key); st.RuntimeJournal != JournalUnknown || st.Exists {
		t.Fatalf("after an unrecorded residency: %+v, want journal unknown", st)
	}
	cp := Checkpoint{Key: key, Host: "host-a", Epoch: 2, Sequence: 3, CompatibilityID: compatA, Namespace: NamespaceFor(key)}
	if err := a.CommitCheckpoint(ctx, cp); err != nil {
		t.Fatal(err)
	}
	st, err = a.LoadSessionState(ctx, key)
	if err != nil || !st.Exists || st.CheckpointSequence != 3 || !st.HasCheckpoint || st.CompatibilityID != compatA || st.RuntimeJournal != JournalPresent {
		t.Fatalf("after checkpoint: %+v, %v", st, err)
	}
	old := cp
	old.Epoch, old.Sequence = 1, 9
	if err := a.CommitCheckpoint(ctx, old); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("checkpoint under epoch 1: %v, want ErrEpochSuperseded", err)
	}
	back := cp
	back.Sequence = 2
	if err := a.CommitCheckpoint(ctx, back); !errors.Is(err, ErrEpochSuperseded) {
		t.Fatalf("checkpoint going backwards: %v, want ErrEpochSuperseded", err)
	}
	other := cp
	other.Host = "host-b"
	if err := a.CommitCheckpoint(ctx, other); !errors.Is(err, ErrForbidden) {
		t.Fatalf("checkpoint for another host: %v, want ErrForbidden", err)
	}
}

// A repeated acquire under the same token (its first answer lost) gets the
// grant it made back; any other acquire is refused while it lives.
func TestKVLeases_AcquireTokenIdempotent(t *testing.T) {
	s := newServiceEnv(t, 2*time.Second)
	ctx := testCtx(t)
	key := Key{Tenant: tenant, Session: "idem-1"}
	g1, err := s.cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil || g2.Epoch != g1.Epoch || g2.Revision != g1.Revision || g2.Token != "tok-1" {
		t.Fatalf("repeat: %+v, %v; want %+v", g2, err, g1)
	}
	if _, err := s.cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-2"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("other token: %v, want ErrLeaseHeld", err)
	}
	if _, err := s.cp.leases.AcquireSessionLeaseToken(ctx, key, "host-b", "tok-1"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("other holder, same token: %v, want ErrLeaseHeld", err)
	}
	if err := s.cp.leases.ReleaseSessionLease(ctx, g1); err != nil {
		t.Fatal(err)
	}
	g3, err := s.cp.leases.AcquireSessionLeaseToken(ctx, key, "host-a", "tok-1")
	if err != nil || g3.Epoch != 2 {
		t.Fatalf("after release, same token: %+v, %v; want a new grant at epoch 2", g3, err)
	}
}
