package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Who runs first, end to end (issue 34): a real control plane with a
// scheduling policy file, embedded NATS, and real agents over
// internal/noopruntime, whose workloads end as their Run's environment says
// (noopruntime.EnvExitAfter and the others), so a test needs no containers.

// slotMillis is one Run's CPU in these tests; a node offers a whole number
// of such slots, so "the fleet is full" is a count of Runs.
const slotMillis = 1000

// withPolicy gives the fleet pol as its scheduling policy file and serves
// tenants besides the default one.
func withPolicy(t *testing.T, pol schemas.SchedulingPolicy, tenants ...string) func(*controlplane.Config) {
	t.Helper()
	b, err := json.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "scheduling-policy.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return func(c *controlplane.Config) {
		c.SchedulingPolicyFile = path
		c.Tenants = append(c.Tenants, tenants...)
	}
}

// noopNodeSpec describes an agent over the no-op runtime.
type noopNodeSpec struct {
	id string
	// slots is how many one-slot Runs fit at once (1 when 0).
	slots int64
	// gpus are the UUIDs of the node's fake cards (NVIDIA L4), each
	// offered by a CDI spec of the node's own.
	gpus []string
	// opts tune the runtime; it holds noopImage's digest unless Images
	// says otherwise.
	opts noopruntime.Options
}

// noopNode is one running agent over the no-op runtime.
type noopNode struct {
	id    string
	agent *agent.Agent
	rt    *noopruntime.Runtime
	part  *part
}

// startNoopNode starts an agent over the no-op runtime and waits until it
// is enrolled and, with cards, until its facts offer them.
func (f *fleet) startNoopNode(spec noopNodeSpec) *noopNode {
	f.t.Helper()
	if spec.slots == 0 {
		spec.slots = 1
	}
	if spec.opts.Images == nil {
		spec.opts.Images = []string{noopDigest}
	}
	cfg := agent.Config{NodeID: spec.id, Generation: 1, DataDir: tempDir(f.t), StopGrace: time.Second,
		Capacity: schemas.Resources{CPUMillis: spec.slots * slotMillis, MemoryBytes: 8 << 30}}
	if len(spec.gpus) > 0 {
		dir := f.t.TempDir()
		writeCDISpecFor(f.t, dir, spec.gpus...)
		cfg.Accelerator = fakeCards([]string{dir}, spec.gpus...)
	}
	rt := noopruntime.New(spec.opts)
	conn, err := bus.Connect(f.nats.URL(), spec.id, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	a, err := agent.New(cfg, conn, rt, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := newPart(cancel, func() error { defer conn.Close(); return a.Run(ctx) })
	f.t.Cleanup(func() { p.stop(f.t) })
	f.waitNode(spec.id, a)
	if len(spec.gpus) > 0 {
		f.eventually(20*time.Second, spec.id+"'s cards in its facts", func() bool {
			rec := f.nodeRecord(spec.id)
			if rec.Facts == nil || rec.Capacity.GPUCount != int64(len(spec.gpus)) {
				return false
			}
			cards := rec.Facts.Host.Accelerator.Cards
			return len(cards) == len(spec.gpus) && !slices.ContainsFunc(cards, func(c schemas.GPUCard) bool { return len(c.CDIDevices) == 0 })
		})
	}
	return &noopNode{id: spec.id, agent: a, rt: rt, part: p}
}

// running is the attempt ids of the workloads the node's runtime runs now.
func (n *noopNode) running(t *testing.T) []string {
	t.Helper()
	list, err := n.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range list {
		if w.State == noderuntime.WorkloadRunning {
			out = append(out, w.ID)
		}
	}
	return out
}

// noopRun is a one-slot Run of the no-op image whose workload behaves as
// env says (noopruntime.EnvExitAfter, ...; nil: runs until stopped).
func noopRun(requestID string, env map[string]string) schemas.RunRequest {
	return schemas.RunRequest{RequestID: requestID, Image: noopImage, Resources: schemas.Resources{CPUMillis: slotMillis, MemoryBytes: 64 << 20}, Env: env}
}

// exitAfter is a noop workload's environment: exit 0 after d.
func exitAfter(d time.Duration) map[string]string {
	return map[string]string{noopruntime.EnvExitAfter: d.String()}
}

// submitAs submits req as tenant's operator and returns the Run's id.
func (f *fleet) submitAs(tenant string, req schemas.RunRequest) string {
	f.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publish(bus.SubmitSubject(tenant, bus.OperatorUser), b, req.RequestID)
	return schemas.RunIDFor(tenant, req.RequestID)
}

// submitManyAs submits reqs as tenant without waiting for each ack in
// turn, and returns the Runs' ids once every one is stored in the intake
// stream.
func (f *fleet) submitManyAs(tenant string, reqs []schemas.RunRequest) []string {
	f.t.Helper()
	ids := make([]string, len(reqs))
	for i, req := range reqs {
		b, err := json.Marshal(req)
		if err != nil {
			f.t.Fatal(err)
		}
		m := &nats.Msg{Subject: bus.SubmitSubject(tenant, bus.OperatorUser), Data: b, Header: nats.Header{}}
		if _, err := f.conn.JS.PublishMsgAsync(m, jetstream.WithMsgID(req.RequestID)); err != nil {
			f.t.Fatalf("publish %s: %v", req.RequestID, err)
		}
		ids[i] = schemas.RunIDFor(tenant, req.RequestID)
	}
	select {
	case <-f.conn.JS.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		f.t.Fatal("submissions not acknowledged in 60s")
	}
	return ids
}

// waitRun waits until the Run satisfies cond and returns it.
func (f *fleet) waitRun(id, what string, within time.Duration, cond func(schemas.Run) bool) schemas.Run {
	f.t.Helper()
	var r schemas.Run
	f.eventually(within, "run "+id+": "+what, func() bool {
		var ok bool
		r, ok = f.run(id)
		return ok && cond(r)
	})
	return r
}

// holds reports whether r holds its place on a node now: booked, out of
// its node's queue, not ended.
func holds(r schemas.Run) bool {
	return r.NodeID != "" && !r.Queued && !r.Phase.Terminal() && r.Phase != schemas.PhaseAccepted
}

// tenantEvents reads every event of tenant's Runs that WF_EVENTS holds,
// ordered by when the control plane recorded them (stream order among
// equal times).
func (f *fleet) tenantEvents(tenant string) []schemas.RunEvent {
	out := f.eventsOn(bus.RunEventsSubject(tenant, "*"))
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// requeued returns the events that sent a Run back to accepted from an
// attempt with code.
func requeued(evs []schemas.RunEvent, code schemas.Code) []schemas.RunEvent {
	var out []schemas.RunEvent
	for _, ev := range evs {
		if ev.Type == schemas.EventPhase && ev.Phase == schemas.PhaseAccepted && ev.From != "" && ev.From != schemas.PhaseAccepted && ev.Code == code {
			out = append(out, ev)
		}
	}
	return out
}

// victimsNamed returns the victims the Run's decisions name.
func victimsNamed(evs []schemas.RunEvent) []schemas.Victim {
	var out []schemas.Victim
	for _, ev := range evs {
		if ev.Decision != nil {
			out = append(out, ev.Decision.Victims...)
		}
	}
	return out
}

// unchanged fails t when a Run's record moved since before: another
// event, phase, attempt, node, queue place or a stop under way.
func unchanged(t *testing.T, before, after schemas.Run) {
	t.Helper()
	if after.EventSeq != before.EventSeq || after.Phase != before.Phase || after.AttemptID != before.AttemptID ||
		after.NodeID != before.NodeID || after.Queued != before.Queued || after.Stopping != "" {
		t.Errorf("run %s changed: was %s attempt %s on %s (queued %v, %d events), now %s attempt %s on %s (queued %v, %d events, stopping %q)",
			before.ID, before.Phase, before.AttemptID, before.NodeID, before.Queued, before.EventSeq,
			after.Phase, after.AttemptID, after.NodeID, after.Queued, after.EventSeq, after.Stopping)
	}
}

// cancelAs cancels tenant's Run as its operator.
func (f *fleet) cancelAs(tenant, id string) {
	f.t.Helper()
	f.publish(bus.CancelSubject(tenant, bus.OperatorUser), []byte(`{"run_id":"`+id+`","grace_seconds":1}`), "")
}
