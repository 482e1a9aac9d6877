package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestRespondOnlyToInboxes: an answer goes to a reply inbox, never to a
// reply subject a stream or bucket captures (nats-server checks no
// permission on a reply subject).
func TestRespondOnlyToInboxes(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range []string{"$KV.victim.key", "wf.events.b.run.r-1", "_INBOXX.a"} {
		if err := bus.Respond(&nats.Msg{Subject: "wf.tenant.a.runs.list", Reply: reply, Sub: &nats.Subscription{}}, codec.JSON, map[string]string{"a": "b"}); err == nil {
			t.Errorf("answered on %q", reply)
		}
	}
	if _, err := kv.Get(ctx, "key"); err == nil {
		t.Fatal("an answer was written into a bucket")
	}
	for _, reply := range []string{nats.NewInbox(), "_WF_INBOX.producer.p.x"} {
		if !bus.IsInbox(reply) {
			t.Errorf("%q is an inbox", reply)
		}
	}
	sub, err := nc.SubscribeSync("_WF_INBOX.producer.p.>")
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	req, err := nc.SubscribeSync("svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("svc", "_WF_INBOX.producer.p.1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	m, err := req.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Respond(m, codec.JSON, map[string]string{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no answer on the inbox: %v", err)
	}
}
