package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestProvisionBoundsExistingRunsAndEvents: a WF_EVENTS and a wf_runs made
// before they were bounded (no max age, no marker TTL) get the max age and
// the purge markers' TTL when provisioned again, keeping their data.
func TestProvisionBoundsExistingRunsAndEvents(t *testing.T) {
	conn := testenv.Dial(t, testenv.StartNATS(t).URL(), "test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.JS.CreateStream(ctx, jetstream.StreamConfig{Name: bus.StreamEvents, Subjects: []string{"wf.events.run.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := conn.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bus.BucketRuns, History: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "r-old", []byte(`{"id":"r-old"}`)); err != nil {
		t.Fatal(err)
	}
	topo := bus.Topology{EventsMaxAge: 48 * time.Hour, RunsPurgeMarkerTTL: 2 * time.Minute}
	if err := bus.Provision(ctx, conn.JS, topo); err != nil {
		t.Fatal(err)
	}
	events, err := conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := events.CachedInfo().Config.MaxAge; got != 48*time.Hour {
		t.Errorf("WF_EVENTS max age %s after provisioning, want 48h", got)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := status.(*jetstream.KeyValueBucketStatus).LimitMarkerTTL(); got != 2*time.Minute {
		t.Errorf("wf_runs marker TTL %s after provisioning, want 2m", got)
	}
	if _, err := kv.Get(ctx, "r-old"); err != nil {
		t.Errorf("a Run stored before lost: %v", err)
	}
	if got := (bus.Topology{}).StreamConfigs(); got[1].Name != bus.StreamEvents || got[1].MaxAge != bus.DefaultEventsMaxAge {
		t.Errorf("an unset events max age gives %s, want the default %s", got[1].MaxAge, bus.DefaultEventsMaxAge)
	}
}
