package controlplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/metrics"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestCostFiguresFollowWFUsage: the control plane's usage ledger runs with
// it: a record stored on WF_USAGE shows in its cost figures, and a replica
// started again reads the same figure back from the stream.
func TestCostFiguresFollowWFUsage(t *testing.T) {
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ended := time.Now().UTC()
	rec := schemas.UsageRecord{RunID: "r-1", Tenant: schemas.DefaultTenant, AttemptID: schemas.WorkloadID("r-1", 1), NodeID: "n1",
		GPUModel: "H100", GPUs: 1, HeldFrom: ended.Add(-time.Hour), EndedAt: ended, Seconds: 3600, CostUSD: 4.25}
	b, err := codec.Encode(codec.JSON, rec)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: bus.UsageSubject(rec.Tenant), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	if _, err := pl.conn.JS.PublishMsg(ctx, m, jetstream.WithMsgID(bus.UsageMsgID(rec.AttemptID))); err != nil {
		t.Fatal(err)
	}
	want := metrics.CostUSD{Tenant: schemas.DefaultTenant, GPUModel: "H100", USD: 4.25}
	shows := func() bool {
		usd := pl.cp.Metrics().Cost.USD
		return len(usd) == 1 && usd[0] == want
	}
	eventually(t, 10*time.Second, "the record in the cost figures", shows)
	pl.stop()
	pl.start(t, controlplane.Config{WaitForCapacity: true})
	eventually(t, 10*time.Second, "the record in the restarted replica's figures", shows)
}
