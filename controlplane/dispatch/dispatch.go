// Package dispatch sends node agents their commands on WF_CMDS, stamped
// with the node's current session (fencing token and generation) and with
// operation ids derived from the attempt, so a resend is applied once.
package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/schemas"
)

// Dispatcher sends commands to nodes.
type Dispatcher struct {
	js    jetstream.JetStream
	cache *cache.Cache
	now   func() time.Time
	log   *zap.Logger
	sent  atomic.Int64
}

// New returns a dispatcher publishing through js to the nodes c knows.
func New(js jetstream.JetStream, c *cache.Cache, now func() time.Time, log *zap.Logger) *Dispatcher {
	return &Dispatcher{js: js, cache: c, now: now, log: log}
}

// Sent counts commands published.
func (d *Dispatcher) Sent() int64 { return d.sent.Load() }

// OpID names an attempt's command. Ids are derived from the attempt, so
// sending a command again (after a crash, on a stuck Run) reuses the id and
// the node applies it once.
func OpID(attemptID, verb string) string { return attemptID + "." + verb }

// Launch sends the PrepareImage and LaunchWorkload commands for the Run's
// current attempt, stamped with the node's current fencing token.
func (d *Dispatcher) Launch(ctx context.Context, run schemas.Run) error {
	node, ref, err := d.target(run)
	if err != nil {
		return err
	}
	env := make([]schemas.EnvVar, 0, len(run.Request.Env))
	for k, v := range run.Request.Env {
		env = append(env, schemas.EnvVar{Name: k, Value: v})
	}
	var devices []string
	if len(run.GPUs) > 0 || run.Request.Resources.GPUCount > 0 {
		var ok bool
		facts := schemas.AcceleratorFacts{}
		if node.Facts != nil {
			facts = node.Facts.Host.Accelerator
		}
		if devices, ok = facts.CDIDevicesFor(run.GPUs); !ok || int64(len(run.GPUs)) != run.Request.Resources.GPUCount {
			// Never a silent CPU run: a GPU attempt goes out with the CDI
			// device of every card it holds, or not at all.
			return fmt.Errorf("dispatch %s: GPUs %v booked on node %s have no CDI device in its facts", run.ID, run.GPUs, node.NodeID)
		}
	}
	launch := d.command(node, OpID(run.AttemptID, "launch"), schemas.CmdLaunchWorkload)
	launch.Launch = &schemas.LaunchWorkload{
		RunID: run.ID, Tenant: run.TenantOf(), AttemptID: run.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest, Platform: run.Request.Platform,
		Command: append(append([]string(nil), run.Request.Command...), run.Request.Args...), Env: env,
		Resources: run.Request.Resources, MaxRuntimeSeconds: run.Request.MaxRuntimeSeconds, Caches: run.Request.Caches,
		GPUs: run.GPUs, Devices: devices,
		Network: run.Request.Network, ShmBytes: run.Request.ShmBytes, Ulimits: run.Request.Ulimits,
		Artifacts: run.Artifacts,
	}
	for _, c := range d.prepare(node, ref, run) {
		if err := d.Send(ctx, c); err != nil {
			return err
		}
	}
	return d.Send(ctx, launch)
}

// Prepare sends only the PrepareImage command: a queued Run prefetches
// its image while it waits for room. A node that declares no Prewarm
// (NodeSupport) takes no prepare-only command; its launch fetches the
// image instead, so sending nothing is not an error.
func (d *Dispatcher) Prepare(ctx context.Context, run schemas.Run) error {
	node, ref, err := d.target(run)
	if err != nil {
		return err
	}
	if !node.Facts.Supports().Prewarm {
		d.log.Debug("no prewarm on this node; the image comes with the launch", zap.String("node_id", node.NodeID), zap.String("run_id", run.ID))
		return nil
	}
	for _, c := range d.prepare(node, ref, run) {
		if err := d.Send(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// Prefetch sends one node a PrepareImage for an operator's prefetch, under
// opID (derived from the prefetch and the node, so a resend is applied
// once), stamped with the node's current session.
func (d *Dispatcher) Prefetch(ctx context.Context, nodeID, opID, prefetchID string, ref schemas.ImageRef) error {
	node, ok := d.cache.Node(nodeID)
	if !ok {
		return fmt.Errorf("prefetch %s: node %s not in registry", prefetchID, nodeID)
	}
	if !node.Facts.Supports().Prewarm {
		return fmt.Errorf("prefetch %s: node %s declares no prewarm; it takes no preparation work without a Run", prefetchID, nodeID)
	}
	prep := d.command(node, opID, schemas.CmdPrepareImage)
	prep.PrepareImage = &schemas.PrepareImage{PrefetchID: prefetchID, Reference: ref.String(), ManifestDigest: ref.Digest, Unpack: true}
	return d.Send(ctx, prep)
}

// PrefetchArtifact sends one node a PrepareArtifact for an operator's
// prefetch of a (pathless) resolved artifact, under opID, stamped with
// the node's current session; it goes only to a node that declares a
// replica store.
func (d *Dispatcher) PrefetchArtifact(ctx context.Context, nodeID, opID, prefetchID string, a schemas.ArtifactMount) error {
	node, ok := d.cache.Node(nodeID)
	if !ok {
		return fmt.Errorf("prefetch %s: node %s not in registry", prefetchID, nodeID)
	}
	if !node.Facts.Supports().ArtifactReplicas {
		return fmt.Errorf("prefetch %s: node %s declares no artifact replica store; it takes no PrepareArtifact", prefetchID, nodeID)
	}
	prep := d.command(node, opID, schemas.CmdPrepareArtifact)
	prep.PrepareArtifact = &schemas.PrepareArtifact{PrefetchID: prefetchID, Name: a.Name, Digest: a.Digest, SizeBytes: a.SizeBytes, Source: a.Source}
	return d.Send(ctx, prep)
}

// target is the Run's node as cached, and its image.
func (d *Dispatcher) target(run schemas.Run) (schemas.NodeRecord, schemas.ImageRef, error) {
	node, ok := d.cache.Node(run.NodeID)
	if !ok {
		return node, schemas.ImageRef{}, fmt.Errorf("dispatch %s: node %s not in registry", run.ID, run.NodeID)
	}
	ref, err := schemas.ParseImageRef("image", run.Request.Image)
	return node, ref, err
}

// prepare is an attempt's preparation in the order the node applies it
// (one queue per attempt): each artifact, then the image, whose prepared
// report moves the Run on to launching.
func (d *Dispatcher) prepare(node schemas.NodeRecord, ref schemas.ImageRef, run schemas.Run) []schemas.Command {
	cmds := make([]schemas.Command, 0, len(run.Artifacts)+1)
	for i, a := range run.Artifacts {
		c := d.command(node, OpID(run.AttemptID, "artifact"+strconv.Itoa(i)), schemas.CmdPrepareArtifact)
		c.PrepareArtifact = &schemas.PrepareArtifact{RunID: run.ID, AttemptID: run.AttemptID, Name: a.Name, Digest: a.Digest, SizeBytes: a.SizeBytes, Source: a.Source}
		cmds = append(cmds, c)
	}
	prep := d.command(node, OpID(run.AttemptID, "prepare"), schemas.CmdPrepareImage)
	prep.PrepareImage = &schemas.PrepareImage{RunID: run.ID, AttemptID: run.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest,
		Platform: run.Request.Platform, Unpack: true}
	return append(cmds, prep)
}

// Stop asks the Run's node to stop its current attempt.
func (d *Dispatcher) Stop(ctx context.Context, run schemas.Run, reason string) error {
	return d.StopAttempt(ctx, run.NodeID, run.ID, run.AttemptID, run.GraceSeconds, reason)
}

// StopAttempt stops any attempt, including one the control plane has
// moved on from (an orphan on a node that came back).
func (d *Dispatcher) StopAttempt(ctx context.Context, nodeID, runID, attemptID string, grace int64, reason string) error {
	node, ok := d.cache.Node(nodeID)
	if !ok || attemptID == "" {
		return nil
	}
	if grace == 0 {
		grace = schemas.DefaultGraceSeconds
	}
	stop := d.command(node, OpID(attemptID, "stop"), schemas.CmdStopWorkload)
	stop.Stop = &schemas.StopWorkload{RunID: runID, AttemptID: attemptID, GraceSeconds: grace, Reason: reason}
	return d.Send(ctx, stop)
}

func (d *Dispatcher) command(node schemas.NodeRecord, op string, kind schemas.CommandKind) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: node.NodeID, FencingToken: node.FencingToken, Generation: node.Generation,
		Kind: kind, IssuedAt: d.now(),
	}
}

// Send publishes to the node's command subject. The Nats-Msg-Id
// includes the fencing token: a resend under the same session is dropped by
// the stream's dedupe window, a resend under a new session is delivered.
func (d *Dispatcher) Send(ctx context.Context, c schemas.Command) error {
	b, err := codec.Encode(codec.MsgPack, c)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: bus.NodeCmd(c.NodeID), Data: b}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.js.PublishMsg(pctx, m, jetstream.WithMsgID(c.OperationID+":"+strconv.FormatUint(c.FencingToken, 10))); err != nil {
		return fmt.Errorf("send %s to node %s: %w", c.Kind, c.NodeID, err)
	}
	d.sent.Add(1)
	d.log.Debug("command sent", zap.String("node_id", c.NodeID), zap.String("op", c.OperationID), zap.String("kind", string(c.Kind)))
	return nil
}

// AskReconciliation asks every live node for its full account (a
// Reconciliation observation): a control plane that just started may have
// missed reports while it was down, and the answers square its Runs with
// what really runs.
func (d *Dispatcher) AskReconciliation(ctx context.Context) {
	now := d.now()
	for _, n := range d.cache.Nodes() {
		if !n.Live(now) {
			continue
		}
		c := d.command(n, "reconcile."+strconv.FormatInt(now.UnixNano(), 36), schemas.CmdReconcile)
		if err := d.Send(ctx, c); err != nil {
			d.log.Warn("ask node to reconcile", zap.String("node_id", n.NodeID), zap.Error(err))
		}
	}
}
