package schemas_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// The session protocol's field names are what operators type with the nats
// CLI and what older agents send: they must not change.
func TestSessionWireNames(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{schemas.SessionRequest{Tenant: "acme", Session: "s1", Mode: "create", Node: "n1", CompatibilityID: "c", Actor: "ops", GPUCount: 2},
			`{"tenant":"acme","session":"s1","mode":"create","node":"n1","compatibility_id":"c","actor":"ops","gpu_count":2}`},
		{schemas.SessionCommand{FencingToken: 3, Tenant: "acme", Session: "s1", Mode: "resume", CompatibilityID: "c", Actor: "ops", Trace: "t", GPUs: []string{"g"}, Devices: []string{"d"}},
			`{"fencing_token":3,"tenant":"acme","session":"s1","mode":"resume","compatibility_id":"c","actor":"ops","trace":"t","gpus":["g"],"devices":["d"]}`},
		{schemas.SessionReply{Residency: &schemas.ResidencyView{Tenant: "acme", Session: "s1", Host: "n1", Epoch: 2, Generation: 1, Phase: "resident", Workload: "w", Namespace: "ns", CompatibilityID: "c", Attached: true}},
			`{"residency":{"tenant":"acme","session":"s1","host":"n1","lease_epoch":2,"generation":1,"phase":"resident","workload":"w","namespace":"ns","compatibility_id":"c","attached":true}}`},
		{schemas.SessionReply{Error: &schemas.SessionError{Code: "attach_failed", Message: "m", Step: "launch", Unreleased: []string{"lease"}, Unwritten: []string{"route"}}},
			`{"error":{"code":"attach_failed","message":"m","step":"launch","unreleased":["lease"],"unwritten":["route"]}}`},
		{schemas.NodeDrainReply{OK: &schemas.NodeRecord{NodeID: "n1"}, Sessions: &schemas.DrainView{Node: "n1", Released: []schemas.SessionKey{{Tenant: "a", Session: "b"}},
			Failures: []schemas.DrainFailure{{Key: schemas.SessionKey{Tenant: "a", Session: "c"}, Unwritten: []string{"x"}, Reason: "busy"}}}},
			`"sessions":{"node":"n1","released":[{"tenant":"a","session":"b"}],"failures":[{"key":{"tenant":"a","session":"c"},"unwritten":["x"],"reason":"busy"}]}}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), c.want) {
			t.Errorf("%T encodes as\n %s\nwant (suffix)\n %s", c.v, b, c.want)
		}
	}
	// A drain reply is a Reply[NodeRecord] to every caller that reads only
	// the record.
	b, _ := json.Marshal(schemas.NodeDrainReply{OK: &schemas.NodeRecord{NodeID: "n1"}, Sessions: &schemas.DrainView{Node: "n1"}})
	var rep schemas.Reply[schemas.NodeRecord]
	if err := json.Unmarshal(b, &rep); err != nil || rep.OK == nil || rep.OK.NodeID != "n1" {
		t.Fatalf("a drain reply read as Reply[NodeRecord]: %+v %v", rep, err)
	}
	if err := codec.Decode(codec.JSON, []byte(`{"tenant":"a","session":"b"}`), new(schemas.SessionRequest)); err != nil {
		t.Fatalf("a minimal session request: %v", err)
	}
}

func TestSessionErrorText(t *testing.T) {
	e := &schemas.SessionError{Code: "release_incomplete", Message: "lost", Unreleased: []string{"lease"}, Unwritten: []string{"route"}}
	if got, want := e.Error(), "release_incomplete: lost (still held: [lease]) (not written: [route])"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
