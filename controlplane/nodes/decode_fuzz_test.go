package nodes

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzHeartbeatDecode: whatever a heartbeat's body, decoding it never
// panics, and one it accepts is within the message limit, has a valid
// node id and every field within the limits on node messages.
// Seeds are in testdata/fuzz/FuzzHeartbeatDecode.
func FuzzHeartbeatDecode(f *testing.F) {
	for _, hb := range []schemas.Heartbeat{{NodeID: "node-a", FencingToken: 3, SentAt: time.Unix(1700000000, 0), Running: 2}, {}} {
		for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
			b, err := codec.Encode(enc, hb)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var hb schemas.Heartbeat
		if err := decodeHeartbeat(&nats.Msg{Subject: bus.NodeHeartbeat("node-a"), Data: body}, &hb); err != nil {
			return
		}
		if len(body) > schemas.MaxNodeMessageBytes {
			t.Fatalf("a heartbeat of %d bytes was decoded", len(body))
		}
		if err := schemas.ValidateID("node_id", hb.NodeID, schemas.CodeMalformed); err != nil || hb.Running < 0 {
			t.Fatalf("accepted heartbeat %+v: %v", hb, err)
		}
		if err := schemas.CheckNodeSizes("", &hb); err != nil {
			t.Fatalf("accepted heartbeat past a limit: %v", err)
		}
	})
}

// FuzzRenewalDecode: the renewal server (as Serve runs it) refuses what
// does not decode strictly or is past a limit before the answer sees it,
// and never panics; every renewal the answer sees is valid and bounded.
// Seeds are in testdata/fuzz/FuzzRenewalDecode.
func FuzzRenewalDecode(f *testing.F) {
	for _, r := range []schemas.SessionRenewal{{NodeID: "node-a", SessionToken: "tok-0123456789abcdef", FencingToken: 3}, {NodeID: "node-a"}} {
		for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
			b, err := codec.Encode(enc, r)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	var failed error
	srv := renewalServer(func(_ context.Context, _ string, r schemas.SessionRenewal) (schemas.SessionRenewal, error) {
		if err := schemas.ValidateID("node_id", r.NodeID, schemas.CodeMalformed); err != nil {
			failed = err
		} else if err := schemas.CheckNodeSizes("", &r); err != nil {
			failed = err
		}
		return r, nil
	}, zap.NewNop())
	f.Fuzz(func(t *testing.T, body []byte) {
		failed = nil
		srv.Handle(context.Background(), &nats.Msg{Subject: bus.NodeRenew("node-a"), Data: body}) // no reply subject: nothing sent
		if failed != nil {
			t.Fatalf("the answer saw a renewal past the limits: %v", failed)
		}
	})
}

// TestDecodeHeartbeat_Bounded: a heartbeat past the message limit, with an
// unknown field or a negative count is dropped; a plain one decodes.
func TestDecodeHeartbeat_Bounded(t *testing.T) {
	var hb schemas.Heartbeat
	big := make([]byte, schemas.MaxNodeMessageBytes+1)
	copy(big, `{"node_id":"node-a"}`)
	for name, body := range map[string][]byte{
		"oversized":      big,
		"unknown field":  []byte(`{"node_id":"node-a","fencing_token":1,"extra":1}`),
		"negative count": []byte(`{"node_id":"node-a","fencing_token":1,"running":-3}`),
		"bad node id":    []byte(`{"node_id":"node/a","fencing_token":1}`),
	} {
		var hb schemas.Heartbeat // fresh: a field left by an earlier case must not decide this one
		if err := decodeHeartbeat(&nats.Msg{Data: body}, &hb); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := decodeHeartbeat(&nats.Msg{Data: []byte(`{"node_id":"node-a","fencing_token":1,"running":2}`)}, &hb); err != nil || hb.Running != 2 {
		t.Errorf("a plain heartbeat: %+v, %v", hb, err)
	}
}
