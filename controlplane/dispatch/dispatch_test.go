package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// A queued Run's prepare-only command goes to a node that declares Prewarm
// (or declares nothing, as agents before NodeSupport), never to one that
// declares it does not take such work.
func TestPrepareOnlyWhereThePrewarmIsDeclared(t *testing.T) {
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "dispatch-test", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	c := cache.New()
	for i, sup := range map[string]*schemas.NodeSupport{
		"prewarm":    {ContainerRuntime: "containerd", ExactImageInventory: true, Prewarm: true},
		"no-prewarm": {ContainerRuntime: "example", ExactImageInventory: true, Prewarm: false},
		"undeclared": nil,
	} {
		c.NoteNode(schemas.NodeRecord{NodeID: i, FencingToken: 1, Generation: 1, State: schemas.NodeReady, Facts: &schemas.NodeFacts{Support: sup}}, 1)
	}
	d := New(conn.JS, c, time.Now, zap.NewNop())
	img := "registry.example/app@sha256:" + "a172cedcae47474b615c54d510a5d84a8dea3032e958587430b413538be3f333"
	for _, node := range []string{"prewarm", "no-prewarm", "undeclared"} {
		run := schemas.Run{ID: "r-" + node, AttemptID: "r-" + node + ".1", NodeID: node, Queued: true, Request: schemas.RunRequest{Image: img}}
		if err := d.Prepare(ctx, run); err != nil {
			t.Fatalf("Prepare on %s: %v", node, err)
		}
	}
	// An operator's prefetch is refused there too.
	ref, _ := schemas.ParseImageRef("image", img)
	if err := d.Prefetch(ctx, "no-prewarm", "pf-1.no-prewarm", "pf-1", ref); err == nil {
		t.Error("a prefetch was sent to a node that declares no prewarm")
	}
	stream, err := conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]bool{"prewarm": true, "no-prewarm": false, "undeclared": true} {
		m, err := stream.GetLastMsgForSubject(ctx, bus.NodeCmd(node))
		switch {
		case want && err != nil:
			t.Errorf("%s: no prepare sent: %v", node, err)
		case !want && !errors.Is(err, jetstream.ErrMsgNotFound):
			t.Errorf("%s declares no prewarm, yet got a command (%v, err %v)", node, m, err)
		}
	}
}
