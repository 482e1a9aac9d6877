package agent

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

// reporter publishes what this node observes on wf.node.<id>.obs, stamped
// with its current session.
type reporter struct {
	js      jetstream.JetStream
	nodeID  string
	session func() schemas.Enrollment
	now     func() time.Time
	log     *zap.Logger
}

// publish sends one observation. dedupeID, when set, lets JetStream drop a
// repeat of the same report.
func (r *reporter) publish(ctx context.Context, o schemas.Observation, dedupeID string) error {
	enr := r.session()
	o.NodeID, o.FencingToken, o.Generation = r.nodeID, enr.FencingToken, enr.Generation
	b, err := codec.Encode(codec.MsgPack, o)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: bus.NodeObs(r.nodeID), Data: b}
	var opts []jetstream.PublishOpt
	if dedupeID != "" {
		opts = append(opts, jetstream.WithMsgID(dedupeID))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.js.PublishMsg(pctx, m, opts...); err != nil {
		return fmt.Errorf("agent: publish %s: %w", o.Kind, err)
	}
	return nil
}

// workload publishes a workload observation stamped with this machine's
// clock; a report that cannot be published is logged and dropped.
func (r *reporter) workload(ctx context.Context, w schemas.WorkloadObservation) {
	if w.ObservedAt.IsZero() {
		w.ObservedAt = r.now()
	}
	if err := r.publish(ctx, schemas.Observation{Kind: schemas.ObsWorkload, Workload: &w}, ""); err != nil && ctx.Err() == nil {
		r.log.Warn("workload report not published", zap.String("run_id", w.RunID), zap.String("phase", string(w.Phase)), zap.Error(err))
	}
}

// receipt sends a command's receipt, deduplicated per operation and
// session: a redelivered command's receipt is stored once.
func (r *reporter) receipt(ctx context.Context, c schemas.Command, rc schemas.OperationReceipt) error {
	dedupe := "rcpt:" + c.OperationID + ":" + strconv.FormatUint(c.FencingToken, 10)
	return r.publish(ctx, schemas.Observation{Kind: schemas.ObsReceipt, Receipt: &rc}, dedupe)
}
