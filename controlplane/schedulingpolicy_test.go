package controlplane_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestSchedulingPolicyFileRefusedAtStart: a policy file that does not
// validate stops the control plane before anything is provisioned, naming
// the field.
func TestSchedulingPolicyFileRefusedAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, []byte(`{"tenants":{"acme":{"budget":{"amount_usd":-1,"period":"day"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "cp")
	_, err := controlplane.New(context.Background(), conn, controlplane.Config{SchedulingPolicyFile: path}, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "tenants.acme.budget.amount_usd") || !strings.Contains(err.Error(), "warmfleet policy check") {
		t.Fatalf("New with a negative budget: %v, want the refusal naming the field", err)
	}
	if _, serr := conn.JS.Stream(context.Background(), bus.StreamEvents); serr == nil {
		t.Fatal("streams were provisioned for a control plane that refused its policy")
	}
}

// TestSchedulingPolicyFileServed: the control plane's intake refuses a
// class its policy file does not define; a bad new file keeps the policy
// and is counted in the metrics.
func TestSchedulingPolicyFileServed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	write := func(data string) {
		t.Helper()
		if err := os.WriteFile(path+".new", []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"priority_classes":[{"name":"urgent","value":10,"preempts":true}]}`)
	pl := startTestPlane(t, controlplane.Config{WaitForCapacity: true, SchedulingPolicyFile: path})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := pl.conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	submit := func(id, priority string) schemas.RunEvent {
		t.Helper()
		b, _ := json.Marshal(schemas.RunRequest{RequestID: id, Image: "registry.example/app@sha256:" + strings.Repeat("1", 64), Priority: priority})
		if _, err := pl.conn.JS.Publish(ctx, bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), b); err != nil {
			t.Fatal(err)
		}
		var ev schemas.RunEvent
		eventually(t, 10*time.Second, id+" answered", func() bool {
			m, err := stream.GetLastMsgForSubject(ctx, bus.RunEventsSubject(schemas.DefaultTenant, schemas.RunIDFor(schemas.DefaultTenant, id)))
			return err == nil && json.Unmarshal(m.Data, &ev) == nil
		})
		return ev
	}
	if ev := submit("p-1", "batch"); ev.Type != schemas.EventRejected || ev.Code != schemas.CodePriorityUnknown || !strings.Contains(ev.Message, "urgent") {
		t.Fatalf("unknown class: %+v", ev)
	}
	if ev := submit("p-2", "urgent"); ev.Type == schemas.EventRejected {
		t.Fatalf("known class rejected: %+v", ev)
	}
	write(`{"priority_classes":[{"name":"urgent","value":10}],"default_priority":"none"}`)
	time.Sleep(1100 * time.Millisecond) // past the file's stat interval
	if ev := submit("p-3", "urgent"); ev.Type == schemas.EventRejected {
		t.Fatalf("a bad new policy file replaced the policy: %+v", ev)
	}
	if got := pl.cp.Metrics().PolicyReloadFailures; got != 1 {
		t.Fatalf("policy reload failures = %d, want 1", got)
	}
}
