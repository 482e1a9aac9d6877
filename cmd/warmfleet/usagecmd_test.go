package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestUsageCommand: `warmfleet usage` sums WF_USAGE per tenant and GPU
// model over --since (table and JSON), one tenant with --tenant, skips a
// message that is not a record, and refuses a bad --since or --tenant
// naming the flag.
func TestUsageCommand(t *testing.T) {
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	publish := func(subject, id string, data []byte) {
		t.Helper()
		m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
		if _, err := conn.JS.PublishMsg(ctx, m, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(tenant, run, model string, gpus int64, hours, usd float64, ended time.Time) {
		t.Helper()
		r := schemas.UsageRecord{RunID: run, Tenant: tenant, AttemptID: schemas.WorkloadID(run, 1), NodeID: "n1", GPUModel: model, GPUs: gpus,
			HeldFrom: ended.Add(-time.Duration(hours * float64(time.Hour))), EndedAt: ended, Seconds: hours * 3600, CostUSD: usd}
		b, err := codec.Encode(codec.JSON, r)
		if err != nil {
			t.Fatal(err)
		}
		publish(bus.UsageSubject(tenant), bus.UsageMsgID(r.AttemptID), b)
	}
	rec("acme", "r-1", "H100", 2, 1.5, 12, now.Add(-time.Hour))
	rec("acme", "r-2", "H100", 1, 0.5, 2, now.Add(-2*time.Hour))
	rec("acme", "r-3", "", 0, 2, 0.5, now.Add(-3*time.Hour))
	rec("beta", "r-4", "A100", 4, 1, 8, now.Add(-time.Hour))
	rec("beta", "r-5", "A100", 1, 10, 20, now.Add(-72*time.Hour)) // stored now, ended three days ago
	publish(bus.UsageSubject("acme"), "junk", []byte(`{"run_id":`))

	out, err := cli(t, n.URL(), "usage")
	if err != nil {
		t.Fatalf("usage: %v\n%s", err, out)
	}
	for _, want := range []string{
		"acme    -          1         0.00       2.00        0.50",
		"acme    H100       2         3.50       2.00        14.00",
		"beta    A100       1         4.00       1.00        8.00",
		"TOTAL                                               22.50",
		"(1 stored messages were not usage records",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("usage table lacks %q:\n%s", want, out)
		}
	}

	out, err = cli(t, n.URL(), "-o", "json", "--tenant", "beta", "usage", "--since", "7d")
	if err != nil {
		t.Fatalf("usage -o json: %v\n%s", err, out)
	}
	var rep usageReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("usage -o json: %v\n%s", err, out)
	}
	want := usageRow{Tenant: "beta", GPUModel: "A100", Attempts: 2, GPUHours: 14, HeldHours: 11, CostUSD: 28}
	if rep.Tenant != "beta" || len(rep.Rows) != 1 || rep.Rows[0] != want || rep.TotalUSD != 28 || now.Sub(rep.Since) < 7*24*time.Hour-time.Minute {
		t.Fatalf("beta over 7 days: %+v, want one row %+v", rep, want)
	}

	for _, bad := range [][]string{
		{"usage", "--since", "yesterday"}, {"usage", "--since", "0s"}, {"usage", "--since", "-1h"}, {"usage", "--since", "401d"},
	} {
		if out, err := cli(t, n.URL(), bad...); err == nil || !strings.Contains(err.Error(), `"--since"`) {
			t.Errorf("%v: %v\n%s", bad, err, out)
		}
	}
	if out, err := cli(t, n.URL(), "--tenant", "Not A Tenant", "usage"); err == nil || !strings.Contains(err.Error(), `"--tenant"`) {
		t.Errorf("a malformed --tenant: %v\n%s", err, out)
	}
}

// FuzzParseSince: --since is a positive span of at most 400 days or a
// refusal naming the flag; never a panic.
func FuzzParseSince(f *testing.F) {
	for _, s := range []string{"24h", "7d", "90m", "0s", "-1h", "401d", "yesterday", "d", "1e9d", "9223372036854775807d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseSince(s)
		if err != nil {
			if !strings.Contains(err.Error(), `"--since"`) {
				t.Fatalf("%q: refusal without the flag: %v", s, err)
			}
			return
		}
		if d <= 0 || d > maxUsageSince {
			t.Fatalf("%q accepted as %s", s, d)
		}
	})
}
