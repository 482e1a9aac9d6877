package dispatch

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// A queued Run's prepare-only command goes to a node that declares Prewarm
// (or declares nothing, as agents before NodeSupport), never to one that
// declares it does not take such work.
func TestPrepareOnlyWhereThePrewarmIsDeclared(t *testing.T) {
	conn, ctx := provisioned(t)
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

// A launch goes out as each artifact's PrepareArtifact, then the image's
// PrepareImage (whose prepared report moves the Run to launching), then the
// launch carrying the artifacts' mounts, all of one attempt and each with
// its own operation id.
func TestLaunchPreparesArtifactsFirst(t *testing.T) {
	conn, ctx := provisioned(t)
	c := cache.New()
	c.NoteNode(schemas.NodeRecord{NodeID: "n1", FencingToken: 3, Generation: 1, State: schemas.NodeReady, Facts: &schemas.NodeFacts{}}, 1)
	d := New(conn.JS, c, time.Now, zap.NewNop())
	dig := func(b byte) string { return "sha256:" + strings.Repeat(string(rune('a'+b)), 64) }
	arts := []schemas.ArtifactMount{
		{Name: "weights", Version: "v1", Digest: dig(0), SizeBytes: 10, Source: schemas.ArtifactSource{Object: "sha256/a"}, Path: "/w"},
		{Name: "tok", Version: "v2", Digest: dig(1), SizeBytes: 5, Source: schemas.ArtifactSource{URL: "https://models.example/tok"}, Path: "/t"},
	}
	run := schemas.Run{ID: "r-1", AttemptID: "r-1-a1", NodeID: "n1", Artifacts: arts,
		Request: schemas.RunRequest{Image: "registry.example/app@" + dig(2)}}
	if err := d.Launch(ctx, run); err != nil {
		t.Fatal(err)
	}
	stream, err := conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	var got []schemas.Command
	for seq := uint64(1); seq <= 4; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var cmd schemas.Command
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Validate(); err != nil {
			t.Fatalf("%s: %v", cmd.OperationID, err)
		}
		got = append(got, cmd)
	}
	kinds := []schemas.CommandKind{schemas.CmdPrepareArtifact, schemas.CmdPrepareArtifact, schemas.CmdPrepareImage, schemas.CmdLaunchWorkload}
	for i, cmd := range got {
		if cmd.Kind != kinds[i] || cmd.FencingToken != 3 {
			t.Fatalf("command %d is %s under token %d, want %s under 3", i, cmd.Kind, cmd.FencingToken, kinds[i])
		}
	}
	for i, a := range arts {
		p := got[i].PrepareArtifact
		if p.Digest != a.Digest || p.Source != a.Source || p.AttemptID != run.AttemptID || p.RunID != run.ID || got[i].OperationID != OpID(run.AttemptID, "artifact"+strconv.Itoa(i)) {
			t.Fatalf("prepare %d: %+v (op %s)", i, p, got[i].OperationID)
		}
	}
	if l := got[3].Launch; len(l.Artifacts) != 2 || l.Artifacts[1].Path != "/t" {
		t.Fatalf("launch artifacts: %+v", l.Artifacts)
	}
}

// An operator's artifact prefetch goes as a PrepareArtifact naming the
// prefetch (and no Run) to a node that declares a replica store, stamped
// with its session, and to no other node.
func TestPrefetchArtifactOnlyWhereReplicasAreDeclared(t *testing.T) {
	conn, ctx := provisioned(t)
	c := cache.New()
	for id, sup := range map[string]*schemas.NodeSupport{
		"replicas":    {ContainerRuntime: "containerd", Prewarm: true, ArtifactReplicas: true},
		"no-replicas": {ContainerRuntime: "containerd", Prewarm: true},
		"undeclared":  nil,
	} {
		c.NoteNode(schemas.NodeRecord{NodeID: id, FencingToken: 3, Generation: 1, State: schemas.NodeReady, Facts: &schemas.NodeFacts{Support: sup}}, 1)
	}
	d := New(conn.JS, c, time.Now, zap.NewNop())
	a := schemas.ArtifactMount{Name: "llama", Version: "v1", Digest: "sha256:" + "a172cedcae47474b615c54d510a5d84a8dea3032e958587430b413538be3f333",
		SizeBytes: 42, Source: schemas.ArtifactSource{Object: "llama/v1"}}
	if err := d.PrefetchArtifact(ctx, "replicas", "pf-1.replicas.prefetch", "pf-1", a); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"no-replicas", "undeclared", "ghost"} {
		if err := d.PrefetchArtifact(ctx, node, "pf-1."+node+".prefetch", "pf-1", a); err == nil {
			t.Errorf("an artifact prefetch was sent to %s", node)
		}
	}
	stream, err := conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, bus.NodeCmd("replicas"))
	if err != nil {
		t.Fatal(err)
	}
	var cmd schemas.Command
	if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &cmd); err != nil {
		t.Fatal(err)
	}
	p := cmd.PrepareArtifact
	if err := cmd.Validate(); err != nil || cmd.Kind != schemas.CmdPrepareArtifact || cmd.OperationID != "pf-1.replicas.prefetch" || cmd.FencingToken != 3 || p == nil ||
		p.PrefetchID != "pf-1" || p.RunID != "" || p.AttemptID != "" || p.Name != "llama" || p.Digest != a.Digest || p.SizeBytes != 42 || p.Source != a.Source {
		t.Fatalf("command %+v (%v): %+v", cmd, err, p)
	}
	for _, node := range []string{"no-replicas", "undeclared"} {
		if _, err := stream.GetLastMsgForSubject(ctx, bus.NodeCmd(node)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s declares no replica store, yet got a command (err %v)", node, err)
		}
	}
}

// provisioned is a connection to a fresh NATS with warmfleet's streams and
// buckets, and a context bounding the test.
func provisioned(t *testing.T) (*bus.Conn, context.Context) {
	t.Helper()
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "dispatch-test", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	return conn, ctx
}
