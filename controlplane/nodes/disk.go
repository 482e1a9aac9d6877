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
	"github.com/warmfleet/warmfleet/controlplane/requests"
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

// diskKeep answers a node asking what its disk collection must keep. The
// subject names the asker (an agent may publish only its own), and the
// answer goes only to the node's current session.
func (s *Service) diskKeep(_ context.Context, subject string, req schemas.DiskKeepRequest) (schemas.DiskKeep, error) {
	n, ok := s.cache.Node(req.NodeID)
	switch {
	case subject != bus.NodeDiskKeep(req.NodeID):
		return schemas.DiskKeep{}, &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "node_id", Reason: "a node asks what to keep on its own subject"}
	case !ok:
		return schemas.DiskKeep{}, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "node_id", Reason: "no node " + req.NodeID}
	case req.FencingToken != n.FencingToken:
		return schemas.DiskKeep{}, &schemas.Refusal{Code: schemas.CodeStaleFencingToken, Field: "fencing_token", Reason: "not the node's current session; re-enroll"}
	}
	return s.keepFor(req.NodeID), nil
}

// pruneServer serves wf.admin.node.prune: the agent's own reply is
// relayed as it came.
func (s *Service) pruneServer() *requests.Server[schemas.PruneRequest, schemas.Reply[schemas.PruneReport]] {
	return &requests.Server[schemas.PruneRequest, schemas.Reply[schemas.PruneReport]]{
		Subject: bus.SubjectPrune, Malformed: "body is not a PruneRequest", Validate: (*schemas.PruneRequest).Validate,
		Answer: s.prune, Refuse: requests.Refusal[schemas.PruneReport], Pool: requests.DefaultPool(), Log: s.log,
	}
}

// prune relays an operator's prune to the node's agent, with what the
// node's booked Runs need kept, and answers with the agent's report.
func (s *Service) prune(ctx context.Context, _ string, req schemas.PruneRequest) schemas.Reply[schemas.PruneReport] {
	refuse := func(code schemas.Code, field, reason string) schemas.Reply[schemas.PruneReport] {
		return schemas.Reply[schemas.PruneReport]{Refusal: &schemas.Refusal{Code: code, Field: field, Reason: reason}}
	}
	n, ok := s.cache.Node(req.NodeID)
	switch {
	case !ok:
		return refuse(schemas.CodeUnknownNode, "node_id", "no node "+req.NodeID+"; `warmfleet node list` shows them")
	case !n.Live(s.cfg.Now()):
		return refuse(schemas.CodeNodeNotLive, "node_id", "node "+req.NodeID+" is "+string(n.State)+" and holds no live lease, so no agent would answer; start its agent and retry")
	}
	ask := schemas.DiskPrune{NodeID: n.NodeID, FencingToken: n.FencingToken, DryRun: req.DryRun, Keep: s.keepFor(n.NodeID)}
	b, err := codec.Encode(codec.MsgPack, ask)
	if err != nil {
		return schemas.Reply[schemas.PruneReport]{Refusal: schemas.AsRefusal(err)}
	}
	rctx, cancel := context.WithTimeout(ctx, PruneTimeout)
	defer cancel()
	resp, err := s.conn.NC.RequestWithContext(rctx, bus.NodeDiskPrune(n.NodeID), b)
	if err != nil {
		reason := "node " + n.NodeID + " did not answer the prune: " + err.Error()
		if errors.Is(err, nats.ErrNoResponders) {
			reason = "node " + n.NodeID + "'s agent does not take prunes (no responder; an older agent?)"
		}
		return refuse(schemas.CodeNodeNotLive, "node_id", reason)
	}
	var rep schemas.Reply[schemas.PruneReport]
	if err := decodePruneReply(resp, &rep); err != nil {
		return refuse(schemas.CodeInternal, "", "node "+n.NodeID+" answered the prune with something unreadable or oversized: "+err.Error())
	}
	if rep.OK != nil {
		s.log.Info("node pruned", zap.String("node_id", n.NodeID), zap.Bool("dry_run", req.DryRun), zap.Int("removed", len(rep.OK.Removed)),
			zap.Int64("freed_bytes", rep.OK.FreedBytes), zap.Int("kept", len(rep.OK.Kept)))
	}
	return rep
}

// decodePruneReply decodes a node's answer to a prune, within the limits
// on what a node sends.
func decodePruneReply(resp *nats.Msg, rep *schemas.Reply[schemas.PruneReport]) error {
	if err := schemas.CheckNodeMessageSize(len(resp.Data)); err != nil {
		return err
	}
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, rep); err != nil {
		return err
	}
	if rep.OK != nil {
		if err := rep.OK.Validate(); err != nil {
			return err
		}
	}
	return schemas.CheckNodeSizes("refusal", rep.Refusal)
}
