package sessions

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// fuzzOps are the residency operations' servers as residencyEndpoints
// builds them, with an answer that checks what it is given: the body
// decoded strictly, bounded and validated before the store would see it.
type fuzzOps struct {
	ops    []schemas.ResidencyOp
	handle []func(context.Context, *nats.Msg)
	failed error
}

func fuzzServer[T any, PT validated[T]](o *fuzzOps, op schemas.ResidencyOp, body string) {
	srv := residencyServer[T, none, PT](op, body, func(_ context.Context, _ string, req T) (none, error) {
		if err := schemas.CheckNodeSizes("", &req); err != nil {
			o.failed = err
		}
		return none{}, nil
	}, zap.NewNop())
	o.ops, o.handle = append(o.ops, op), append(o.handle, srv.Handle)
}

// FuzzResidencyRequest: whatever body arrives on any residency operation,
// the node service never panics, and a body it answers is within the
// message limit and every field within the limits on node messages.
// Seeds are in testdata/fuzz/FuzzResidencyRequest.
func FuzzResidencyRequest(f *testing.F) {
	o := &fuzzOps{}
	fuzzServer[schemas.ResidencyKeyRequest](o, schemas.ResidencyLeaseAcquire, "ResidencyKeyRequest")
	fuzzServer[schemas.SessionLeaseGrant](o, schemas.ResidencyLeaseRenew, "SessionLeaseGrant")
	fuzzServer[schemas.SessionLeaseGrant](o, schemas.ResidencyLeaseRelease, "SessionLeaseGrant")
	fuzzServer[schemas.ResidencyObservation](o, schemas.ResidencyRoutePublish, "ResidencyObservation")
	fuzzServer[schemas.ResidencyTombstoneRequest](o, schemas.ResidencyRouteTombstone, "ResidencyTombstoneRequest")
	fuzzServer[schemas.ResidencyKeyRequest](o, schemas.ResidencyStateLoad, "ResidencyKeyRequest")
	fuzzServer[schemas.SessionCheckpoint](o, schemas.ResidencyStateCheckpoint, "SessionCheckpoint")
	for _, op := range []schemas.ResidencyOp{schemas.ResidencyChunkHas, schemas.ResidencyChunkPut, schemas.ResidencyChunkGet, schemas.ResidencyRecordPut, schemas.ResidencyRecordGet} {
		fuzzServer[schemas.CheckpointRequest](o, op, "CheckpointRequest")
	}
	key := schemas.SessionKey{Tenant: "acme", Session: "s-1"}
	for i, body := range []any{
		schemas.ResidencyKeyRequest{Key: key, Token: "t-1"},
		schemas.SessionLeaseGrant{Key: key, Holder: "node-a", Epoch: 2, Revision: 7, Token: "t-1"},
		schemas.SessionLeaseGrant{Key: key, Holder: "node-a", Epoch: 1 << 62},
		schemas.ResidencyObservation{Tenant: "acme", Session: "s-1", Host: "node-a", Epoch: 2, State: "resident", GPUs: []string{"GPU-1"}},
		schemas.ResidencyTombstoneRequest{Key: key, Epoch: 2},
		schemas.ResidencyKeyRequest{Key: key},
		schemas.SessionCheckpoint{Key: key, Host: "node-a", Epoch: 2, Sequence: 3, CompatibilityID: "c@1", Namespace: "ns/acme/s-1"},
	} {
		b, err := json.Marshal(body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Add(uint8(3), []byte(`{"tenant":"acme","gpus":["a","b"],"colour":"red"}`))
	digest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for i, body := range []schemas.CheckpointRequest{
		{Key: key, Epoch: 2, Digest: digest},
		{Key: key, Epoch: 2, Digest: digest, Data: []byte("chunk bytes"), Compressed: true},
		{Key: key, Epoch: 2, Sequence: 4, RecordEpoch: 2, Data: []byte(`{"manifest_pieces":[]}`)},
	} {
		b, err := codec.Encode(codec.MsgPack, body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(7+i), b)
	}
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		i := int(op) % len(o.ops)
		o.failed = nil
		// No reply subject: nothing is sent.
		o.handle[i](context.Background(), &nats.Msg{Subject: bus.NodeResidencyService("node-a", string(o.ops[i])), Data: body})
		if o.failed != nil {
			t.Fatalf("%s answered a body past the limits: %v", o.ops[i], o.failed)
		}
	})
}

// FuzzSessionReplyDecode: whatever a session host answers a command with,
// the control plane's decoder never panics, and a reply it accepts is
// within every limit on node messages.
// Seeds are in testdata/fuzz/FuzzSessionReplyDecode.
func FuzzSessionReplyDecode(f *testing.F) {
	for _, r := range []schemas.SessionReply{
		{Residency: &schemas.ResidencyView{Tenant: "acme", Session: "s-1", Host: "node-a", Epoch: 2, Phase: "resident", Attached: true}},
		{Drain: &schemas.DrainView{Node: "node-a", Released: []schemas.SessionKey{{Tenant: "acme", Session: "s-1"}},
			Failures: []schemas.DrainFailure{{Key: schemas.SessionKey{Tenant: "acme", Session: "s-2"}, Reason: "store down"}}}},
		{Error: &schemas.SessionError{Code: "stale_node", Message: "command for fencing token 3"}},
	} {
		b, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rep, err := decodeSessionReply(body)
		if err != nil {
			return
		}
		if err := schemas.CheckNodeSizes("", &rep); err != nil {
			t.Fatalf("accepted reply past a limit: %v", err)
		}
	})
}
