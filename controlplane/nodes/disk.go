package nodes

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// PruneTimeout bounds how long a prune waits for its node: removing many
// images waits for containerd's garbage collector each time. Operators'
// requests on wf.admin.node.prune should wait a little longer.
const PruneTimeout = 2 * time.Minute

// DiskKeeper names more that a node must keep besides what its booked Runs
// need (e.g. images an operator is prefetching there).
type DiskKeeper interface {
	DiskKeep(nodeID string) []schemas.DiskItem
}

// AddDiskKeeper adds k to what keep answers consult. Call it before Serve.
func (s *Service) AddDiskKeeper(k DiskKeeper) { s.keepers = append(s.keepers, k) }

// keepFor is what node must keep: the image, caches and artifacts of every
// Run booked on it, running or queued, and what the keepers add.
func (s *Service) keepFor(nodeID string) schemas.DiskKeep {
	var k schemas.DiskKeep
	seen := map[string]bool{}
	add := func(it schemas.DiskItem) {
		if key := it.Kind + ":" + it.ID; !seen[key] {
			seen[key] = true
			k.Items = append(k.Items, it)
		}
	}
	active := s.cache.ActiveRuns()
	// By id, so an item several Runs need names the same one every time.
	slices.SortFunc(active, func(a, b *schemas.Run) int { return cmp.Compare(a.ID, b.ID) })
	for _, r := range active {
		if r.NodeID != nodeID || !booked(r.Phase) {
			continue
		}
		why := "booked by run " + r.ID
		if r.Queued {
			why = "queued here for run " + r.ID
		}
		if ref, err := schemas.ParseImageRef("image", r.Request.Image); err == nil && ref.Digest != "" {
			add(schemas.DiskItem{Kind: schemas.DiskItemImage, ID: ref.Digest, Reason: why})
		}
		for _, c := range r.Request.Caches {
			add(schemas.DiskItem{Kind: schemas.DiskItemCache, ID: schemas.CacheItemID(c.Name, c.CompatibilityKey), Reason: why})
		}
		for _, a := range r.Artifacts {
			add(schemas.DiskItem{Kind: schemas.DiskItemArtifact, ID: a.Digest, Reason: why})
		}
	}
	for _, kp := range s.keepers {
		for _, it := range kp.DiskKeep(nodeID) {
			add(it)
		}
	}
	slices.SortFunc(k.Items, func(a, b schemas.DiskItem) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID)) })
	return k
}

// booked: the Run holds (or waits for) a place on its node.
func booked(p schemas.Phase) bool {
	switch p {
	case schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning:
		return true
	}
	return false
}

// handleDiskKeep answers a node asking what its disk collection must keep.
// The subject names the asker (an agent may publish only its own), and the
// answer goes only to the node's current session.
func (s *Service) handleDiskKeep(m *nats.Msg) {
	var req schemas.DiskKeepRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		respond(s.log, m, enc, schemas.Reply[schemas.DiskKeep]{Refusal: schemas.RefusalOfInput(err, "body is not a DiskKeepRequest")})
		return
	}
	nodeID := req.NodeID
	n, ok := s.cache.Node(nodeID)
	switch {
	case m.Subject != bus.NodeDiskKeep(nodeID):
		respond(s.log, m, enc, schemas.Reply[schemas.DiskKeep]{Refusal: &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "a node asks what to keep on its own subject"}})
		return
	case !ok:
		respond(s.log, m, enc, schemas.Reply[schemas.DiskKeep]{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "node_id", Reason: "no node " + nodeID}})
		return
	case req.FencingToken != n.FencingToken:
		respond(s.log, m, enc, schemas.Reply[schemas.DiskKeep]{Refusal: &schemas.Refusal{Code: schemas.CodeStaleFencingToken, Field: "fencing_token",
			Reason: "not the node's current session; re-enroll"}})
		return
	}
	k := s.keepFor(nodeID)
	respond(s.log, m, enc, schemas.Reply[schemas.DiskKeep]{OK: &k})
}

// handlePrune relays an operator's prune to the node's agent, with what
// the node's booked Runs need kept, and answers with the agent's report.
func (s *Service) handlePrune(ctx context.Context, m *nats.Msg) {
	var req schemas.PruneRequest
	enc, err := codec.DecodeMsg(m, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: schemas.RefusalOfInput(err, "body is not a PruneRequest")})
		return
	}
	n, ok := s.cache.Node(req.NodeID)
	switch {
	case !ok:
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "node_id",
			Reason: "no node " + req.NodeID + "; `warmfleet node list` shows them"}})
		return
	case !n.Live(s.cfg.Now()):
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: &schemas.Refusal{Code: schemas.CodeNodeNotLive, Field: "node_id",
			Reason: "node " + req.NodeID + " is " + string(n.State) + " and holds no live lease, so no agent would answer; start its agent and retry"}})
		return
	}
	ask := schemas.DiskPrune{NodeID: n.NodeID, FencingToken: n.FencingToken, DryRun: req.DryRun, Keep: s.keepFor(n.NodeID)}
	b, err := codec.Encode(codec.MsgPack, ask)
	if err != nil {
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: schemas.AsRefusal(err)})
		return
	}
	rctx, cancel := context.WithTimeout(ctx, PruneTimeout)
	defer cancel()
	resp, err := s.conn.NC.RequestWithContext(rctx, bus.NodeDiskPrune(n.NodeID), b)
	if err != nil {
		reason := "node " + n.NodeID + " did not answer the prune: " + err.Error()
		if errors.Is(err, nats.ErrNoResponders) {
			reason = "node " + n.NodeID + "'s agent does not take prunes (no responder; an older agent?)"
		}
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: &schemas.Refusal{Code: schemas.CodeNodeNotLive, Field: "node_id", Reason: reason}})
		return
	}
	var rep schemas.Reply[schemas.PruneReport]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		respond(s.log, m, enc, schemas.Reply[schemas.PruneReport]{Refusal: &schemas.Refusal{Code: schemas.CodeInternal, Reason: "node " + n.NodeID + " answered the prune with something unreadable"}})
		return
	}
	if rep.OK != nil {
		s.log.Info("node pruned", zap.String("node_id", n.NodeID), zap.Bool("dry_run", req.DryRun), zap.Int("removed", len(rep.OK.Removed)),
			zap.Int64("freed_bytes", rep.OK.FreedBytes), zap.Int("kept", len(rep.OK.Kept)))
	}
	respond(s.log, m, enc, rep)
}
