package dispatch_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/controlplane/dispatch"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestLaunch_CommandsCarryTheRunsPlatform: PrepareImage and LaunchWorkload
// name the build the Run asked for, and none when it asked for none (the
// node's own), as read back from WF_CMDS.
func TestLaunch_CommandsCarryTheRunsPlatform(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "dispatch-test")
	c := cache.New()
	c.NoteNode(schemas.NodeRecord{NodeID: "n1", State: schemas.NodeReady, FencingToken: 4, Generation: 2, LeaseExpires: time.Now().Add(time.Hour)}, 1)
	d := dispatch.New(conn.JS, c, time.Now, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := conn.JS.CreateConsumer(ctx, bus.StreamCmds, jetstream.ConsumerConfig{FilterSubject: bus.NodeCmd("n1"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	const image = "registry.example/app@sha256:b0c5d4f6e7a8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192"
	for i, p := range []*schemas.Platform{nil, {OS: "linux", Architecture: "arm64", Variant: "v8"}} {
		attempt := schemas.WorkloadID("r-"+string(rune('a'+i)), 1)
		run := schemas.Run{ID: "r-" + string(rune('a'+i)), AttemptID: attempt, NodeID: "n1",
			Request: schemas.RunRequest{RequestID: "q", Image: image, Platform: p}}
		if err := d.Launch(ctx, run); err != nil {
			t.Fatal(err)
		}
		batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []schemas.Command
		for m := range batch.Messages() {
			var cmd schemas.Command
			if err := codec.Decode(codec.Detect(m.Headers(), m.Data()), m.Data(), &cmd); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Validate(); err != nil {
				t.Fatalf("dispatched command is invalid: %v", err)
			}
			_ = m.Ack()
			got = append(got, cmd)
		}
		if len(got) != 2 || got[0].PrepareImage == nil || got[1].Launch == nil {
			t.Fatalf("dispatched %+v, want a prepare and a launch", got)
		}
		if !reflect.DeepEqual(got[0].PrepareImage.Platform, p) || !reflect.DeepEqual(got[1].Launch.Platform, p) {
			t.Errorf("run for platform %v: prepare names %v, launch %v", p, got[0].PrepareImage.Platform, got[1].Launch.Platform)
		}
	}
}
