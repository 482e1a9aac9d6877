package agent

import (
	"context"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestNetworkModes_FactsAndOffer(t *testing.T) {
	byDefault := newFactsAgent(t, Config{}, stubRuntime{})
	if got := byDefault.meter.facts(context.Background()).Host.NetworkModes; !slices.Equal(got, []string{"bridge", "none"}) {
		t.Errorf("facts of an agent configured with no modes: %v, want host left out", got)
	}
	all := newFactsAgent(t, Config{NetworkModes: []string{"bridge", "host", "none"}}, stubRuntime{})
	if got := all.meter.facts(context.Background()).Host.NetworkModes; !slices.Equal(got, []string{"bridge", "host", "none"}) {
		t.Errorf("facts of an agent allowing host: %v", got)
	}
	for network, want := range map[string]bool{"": true, "bridge": true, "none": true, "host": false} {
		if got := offersNetwork(byDefault.cfg.NetworkModes, network); got != want {
			t.Errorf("offersNetwork(%q) = %v, want %v", network, got, want)
		}
	}
	if !offersNetwork(all.cfg.NetworkModes, "host") {
		t.Error("an agent configured with host does not offer it")
	}
}

func TestWithContainer(t *testing.T) {
	var spec noderuntime.WorkloadSpec
	withContainer(&spec, &schemas.LaunchWorkload{Resources: schemas.Resources{GPUCount: 1}, ShmBytes: 1 << 20,
		Ulimits: []schemas.Ulimit{{Name: "nofile", Soft: 1024, Hard: schemas.UlimitUnlimited}}})
	if spec.Network != noderuntime.NetworkBridge || spec.ShmBytes != 1<<20 || !spec.MemlockUnlimited ||
		!slices.Equal(spec.Ulimits, []noderuntime.Ulimit{{Name: "nofile", Soft: 1024, Hard: noderuntime.Unlimited}}) {
		t.Fatalf("spec %+v", spec)
	}
	spec = noderuntime.WorkloadSpec{}
	withContainer(&spec, &schemas.LaunchWorkload{Network: "none"})
	if spec.Network != noderuntime.NetworkNone || spec.MemlockUnlimited {
		t.Fatalf("spec of a CPU Run on network none: %+v", spec)
	}
}

// TestLaunch_NetworkNotOfferedRefused: a launch asking for a network the
// node does not offer is refused with a coded receipt, and the runtime is
// never asked (stubRuntime panics on a workload call).
func TestLaunch_NetworkNotOfferedRefused(t *testing.T) {
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), "agent-test", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	// No modes configured: host networking is not offered by default.
	a, err := New(Config{NodeID: "node-net", DataDir: t.TempDir()}, conn, stubRuntime{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.journal.Close() })
	c := schemas.Command{OperationID: "a1.launch", NodeID: "node-net", FencingToken: 1, Kind: schemas.CmdLaunchWorkload,
		Launch: &schemas.LaunchWorkload{RunID: "r-1", AttemptID: "a1", Network: "host"}}
	var rc schemas.OperationReceipt
	a.applyLaunch(context.Background(), c, &rc)
	if rc.Outcome != schemas.OutcomeRefused || rc.Code != schemas.CodeNetworkUnavailable || rc.Message == "" {
		t.Fatalf("receipt %+v, want refused with %s", rc, schemas.CodeNetworkUnavailable)
	}
}
