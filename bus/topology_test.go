package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestProvisionIsIdempotent: provisioning again, and after a server restart
// on the same store, keeps every stream and bucket with its data.
func TestProvisionIsIdempotent(t *testing.T) {
	n := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := testenv.Dial(t, n.URL(), "test")
	topo := bus.Topology{Tenants: []string{"a", "default"}}
	if err := bus.Provision(ctx, conn.JS, topo); err != nil {
		t.Fatal(err)
	}
	// Each tenant's submits land in its own intake stream only.
	if _, err := conn.JS.Publish(ctx, bus.SubmitSubject("a", "acme"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]uint64{"a": 1, "default": 0} {
		s, err := conn.JS.Stream(ctx, bus.RunsStream(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs != want {
			t.Fatalf("%s holds %+v (%v), want %d messages", bus.RunsStream(tenant), info.State, err, want)
		}
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "r-keep", []byte(`{"id":"r-keep"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.JS.Publish(ctx, bus.RunEventsSubject("default", "r-keep"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if err := bus.Provision(ctx, conn.JS, topo); err != nil {
			t.Fatalf("%s: provision again: %v", when, err)
		}
		kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := kv.Get(ctx, "r-keep"); err != nil || string(e.Value()) != `{"id":"r-keep"}` {
			t.Fatalf("%s: run record lost: %v", when, err)
		}
		s, err := conn.JS.Stream(ctx, bus.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
			t.Fatalf("%s: events: %v %+v", when, err, info)
		}
		for _, cfg := range topo.StreamConfigs() {
			if _, err := conn.JS.Stream(ctx, cfg.Name); err != nil {
				t.Fatalf("%s: stream %s: %v", when, cfg.Name, err)
			}
		}
	}
	check("second provision")
	n.Restart(t)
	if err := conn.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	check("after restart")
}
