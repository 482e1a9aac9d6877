package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// Operation ids are derived from the attempt, so sending a command again
// (after a crash, on a stuck Run) reuses the id and the node applies it once.
func opID(attemptID, verb string) string { return attemptID + "." + verb }

// sendLaunch sends the PrepareImage and LaunchWorkload commands for the Run's
// current attempt, stamped with the node's current fencing token.
func (cp *ControlPlane) sendLaunch(ctx context.Context, run schemas.Run) error {
	node, ok := cp.cache.node(run.NodeID)
	if !ok {
		return fmt.Errorf("dispatch %s: node %s not in registry", run.ID, run.NodeID)
	}
	ref, err := schemas.ParseImageRef("image", run.Request.Image)
	if err != nil {
		return err
	}
	env := make([]schemas.EnvVar, 0, len(run.Request.Env))
	for k, v := range run.Request.Env {
		env = append(env, schemas.EnvVar{Name: k, Value: v})
	}
	launch := cp.command(node, opID(run.AttemptID, "launch"), schemas.CmdLaunchWorkload)
	launch.Launch = &schemas.LaunchWorkload{
		RunID: run.ID, AttemptID: run.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest,
		Command: append(append([]string(nil), run.Request.Command...), run.Request.Args...), Env: env,
		Resources: run.Request.Resources, MaxRuntimeSeconds: run.Request.MaxRuntimeSeconds, Caches: run.Request.Caches,
	}
	if err := cp.sendPrepare(ctx, run); err != nil {
		return err
	}
	return cp.sendCommand(ctx, launch)
}

// sendPrepare sends only the PrepareImage command: a queued Run prefetches
// its image while it waits for room.
func (cp *ControlPlane) sendPrepare(ctx context.Context, run schemas.Run) error {
	node, ok := cp.cache.node(run.NodeID)
	if !ok {
		return fmt.Errorf("dispatch %s: node %s not in registry", run.ID, run.NodeID)
	}
	ref, err := schemas.ParseImageRef("image", run.Request.Image)
	if err != nil {
		return err
	}
	prep := cp.command(node, opID(run.AttemptID, "prepare"), schemas.CmdPrepareImage)
	prep.PrepareImage = &schemas.PrepareImage{RunID: run.ID, AttemptID: run.AttemptID, Reference: ref.String(), ManifestDigest: ref.Digest, Unpack: true}
	return cp.sendCommand(ctx, prep)
}

// sendStop asks the Run's node to stop its current attempt.
func (cp *ControlPlane) sendStop(ctx context.Context, run schemas.Run, reason string) error {
	return cp.sendStopAttempt(ctx, run.NodeID, run.ID, run.AttemptID, run.GraceSeconds, reason)
}

// sendStopAttempt stops any attempt, including one the control plane has
// moved on from (an orphan on a node that came back).
func (cp *ControlPlane) sendStopAttempt(ctx context.Context, nodeID, runID, attemptID string, grace int64, reason string) error {
	node, ok := cp.cache.node(nodeID)
	if !ok || attemptID == "" {
		return nil
	}
	if grace == 0 {
		grace = schemas.DefaultGraceSeconds
	}
	stop := cp.command(node, opID(attemptID, "stop"), schemas.CmdStopWorkload)
	stop.Stop = &schemas.StopWorkload{RunID: runID, AttemptID: attemptID, GraceSeconds: grace, Reason: reason}
	return cp.sendCommand(ctx, stop)
}

func (cp *ControlPlane) command(node schemas.NodeRecord, op string, kind schemas.CommandKind) schemas.Command {
	return schemas.Command{
		OperationID: op, NodeID: node.NodeID, FencingToken: node.FencingToken, Generation: node.Generation,
		Kind: kind, IssuedAt: cp.now(),
	}
}

// sendCommand publishes to the node's command subject. The Nats-Msg-Id
// includes the fencing token: a resend under the same session is dropped by
// the stream's dedupe window, a resend under a new session is delivered.
func (cp *ControlPlane) sendCommand(ctx context.Context, c schemas.Command) error {
	b, err := codec.Encode(codec.MsgPack, c)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: bus.NodeCmd(c.NodeID), Data: b}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cp.conn.JS.PublishMsg(pctx, m, jetstream.WithMsgID(c.OperationID+":"+strconv.FormatUint(c.FencingToken, 10))); err != nil {
		return fmt.Errorf("send %s to node %s: %w", c.Kind, c.NodeID, err)
	}
	cp.metrics.commandsSent.Add(1)
	cp.log.Debug("command sent", zap.String("node_id", c.NodeID), zap.String("op", c.OperationID), zap.String("kind", string(c.Kind)))
	return nil
}
