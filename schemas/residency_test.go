package schemas_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// The residency protocol's field names are what agents of this version send
// and read, and the KV records' are what operators read with `nats kv get`:
// they must not change, down to the byte (zero values included, which show
// what is omitted).
func TestResidencyWireNames(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	k := schemas.SessionKey{Tenant: "acme", Session: "s1"}
	for _, c := range []struct {
		v    any
		want string
	}{
		{schemas.ResidencyKeyRequest{Key: k, Token: "tok"}, `{"key":{"tenant":"acme","session":"s1"},"token":"tok"}`},
		{schemas.ResidencyKeyRequest{Key: k}, `{"key":{"tenant":"acme","session":"s1"}}`},
		{schemas.ResidencyTombstoneRequest{Key: k, Epoch: 3}, `{"key":{"tenant":"acme","session":"s1"},"epoch":3}`},
		{schemas.ResidencyReply[struct{}]{OK: &struct{}{}}, `{"ok":{}}`},
		{schemas.ResidencyReply[schemas.SessionState]{Error: &schemas.SessionError{Code: "lease_held", Message: "m"}}, `{"error":{"code":"lease_held","message":"m"}}`},
		{schemas.SessionLeaseGrant{Key: k, Holder: "n1", Epoch: 2, Revision: 7, TTL: 15 * time.Second, GrantedAt: at, ExpiresAt: at, Token: "tok"},
			`{"key":{"tenant":"acme","session":"s1"},"holder":"n1","epoch":2,"revision":7,"ttl":15000000000,"granted_at":"2026-01-02T03:04:05.000000006Z","expires_at":"2026-01-02T03:04:05.000000006Z","token":"tok"}`},
		{schemas.SessionLeaseGrant{},
			`{"key":{"tenant":"","session":""},"holder":"","epoch":0,"revision":0,"ttl":0,"granted_at":"0001-01-01T00:00:00Z","expires_at":"0001-01-01T00:00:00Z","token":""}`},
		{schemas.SessionLeaseRecord{Tenant: "acme", Session: "s1", Holder: "n1", Epoch: 2, ExpiresAt: at, GrantedAt: at, RenewedAt: at, Released: true, Token: "tok"},
			`{"tenant":"acme","session":"s1","holder":"n1","epoch":2,"expires_at":"2026-01-02T03:04:05.000000006Z","granted_at":"2026-01-02T03:04:05.000000006Z","renewed_at":"2026-01-02T03:04:05.000000006Z","released":true,"token":"tok"}`},
		{schemas.SessionLeaseRecord{},
			`{"tenant":"","session":"","holder":"","epoch":0,"expires_at":"0001-01-01T00:00:00Z","granted_at":"0001-01-01T00:00:00Z","token":""}`},
		{schemas.ResidencyObservation{Tenant: "acme", Session: "s1", Host: "n1", Epoch: 2, Generation: 4, State: "resident", Accepting: true, Workload: "w",
			CompatibilityID: "c", Namespace: "ns", CPUMillis: 100, MemoryBytes: 200, GPUs: []string{"g"}, ObservedAt: at},
			`{"tenant":"acme","session":"s1","host":"n1","lease_epoch":2,"generation":4,"state":"resident","accepting":true,"workload":"w","compatibility_id":"c","namespace":"ns","cpu_millis":100,"memory_bytes":200,"gpus":["g"],"observed_at":"2026-01-02T03:04:05.000000006Z"}`},
		{schemas.ResidencyObservation{},
			`{"tenant":"","session":"","host":"","lease_epoch":0,"generation":0,"state":"","accepting":false,"observed_at":"0001-01-01T00:00:00Z"}`},
		{schemas.SessionRecord{Tenant: "acme", Session: "s1", Namespace: "ns", CompatibilityID: "c", CheckpointSequence: 3, Epoch: 2, Host: "n1", UpdatedAt: at},
			`{"tenant":"acme","session":"s1","namespace":"ns","compatibility_id":"c","checkpoint_sequence":3,"lease_epoch":2,"host":"n1","updated_at":"2026-01-02T03:04:05.000000006Z"}`},
		{schemas.SessionRecord{},
			`{"tenant":"","session":"","namespace":"","compatibility_id":"","checkpoint_sequence":0,"lease_epoch":0,"host":"","updated_at":"0001-01-01T00:00:00Z"}`},
		{schemas.SessionCheckpoint{Key: k, Host: "n1", Epoch: 2, Sequence: 3, CompatibilityID: "c", Namespace: "ns"},
			`{"Key":{"tenant":"acme","session":"s1"},"Host":"n1","Epoch":2,"Sequence":3,"CompatibilityID":"c","Namespace":"ns"}`},
		{schemas.SessionCheckpoint{},
			`{"Key":{"tenant":"","session":""},"Host":"","Epoch":0,"Sequence":0,"CompatibilityID":"","Namespace":""}`},
		{schemas.SessionState{Exists: true, Namespace: "ns", CompatibilityID: "c", RuntimeJournal: schemas.JournalPresent, HasCheckpoint: true, CheckpointSequence: 3},
			`{"Exists":true,"Namespace":"ns","CompatibilityID":"c","RuntimeJournal":2,"HasCheckpoint":true,"CheckpointSequence":3}`},
		{schemas.SessionState{},
			`{"Exists":false,"Namespace":"","CompatibilityID":"","RuntimeJournal":0,"HasCheckpoint":false,"CheckpointSequence":0}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("%T encodes as\n %s\nwant\n %s", c.v, b, c.want)
		}
	}
	// The journal's numbers are the wire's, and the control plane decodes
	// a request strictly: what an agent sends decodes.
	if schemas.JournalUnknown != 0 || schemas.JournalEmpty != 1 || schemas.JournalPresent != 2 {
		t.Fatal("runtime journal values moved")
	}
	if err := codec.Decode(codec.JSON, []byte(`{"Key":{"tenant":"a","session":"b"},"Host":"n1","Epoch":1,"Sequence":0,"CompatibilityID":"c","Namespace":"ns"}`), new(schemas.SessionCheckpoint)); err != nil {
		t.Fatalf("a checkpoint as agents send it: %v", err)
	}
}

func TestRuntimeJournalText(t *testing.T) {
	for j, want := range map[schemas.RuntimeJournal]string{schemas.JournalUnknown: "unknown", schemas.JournalEmpty: "empty", schemas.JournalPresent: "present", 7: "unknown"} {
		if got := j.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", j, got, want)
		}
	}
}

func TestSessionLeaseRecordLive(t *testing.T) {
	now := time.Now()
	r := schemas.SessionLeaseRecord{Epoch: 3, ExpiresAt: now.Add(time.Second)}
	if !r.Live(now) || r.Live(now.Add(time.Second)) || r.LeaseEpoch() != 3 || !r.LeaseExpiresAt().Equal(r.ExpiresAt) {
		t.Fatalf("lease record %+v: live now %v, at expiry %v, epoch %d", r, r.Live(now), r.Live(now.Add(time.Second)), r.LeaseEpoch())
	}
}
