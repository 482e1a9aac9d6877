// Package nodehost runs the residency Manager inside a node agent: it is the
// noderuntime.SessionHost the agent starts once enrolled.
//
// What it wires, all real:
//   - the session runtime is the agent's node runtime (adapters/containerd in
//     production), so a resident session is a container;
//   - leases, routes and durable state are the control plane's stores
//     (wf_leases, wf_residency, wf_sessions), reached over request/reply on
//     wf.node.<id>.residency.* (residency.Remote): agents never write KV;
//   - the inbox is the session's durable consumer on WF_INBOX, created by the
//     control plane with the lease and pulled only by the lease holder;
//   - the admission ledger is one object: Admit, every published observation
//     (accepting=false once draining) and the drain all read it.
//
// The control plane drives the host over core request/reply on
// wf.node.<id>.sessions.<op> (attach, release, list, drain), stamped with the
// node's fencing token; a command for another session of the node is refused.
package nodehost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
	"github.com/warmfleet/warmfleet/schemas"
)

// Options configures a Host.
type Options struct {
	// Target is the session runtime this node launches. Required.
	Target residency.RuntimeTarget
	// Capacity is how many sessions may be resident at once. Required.
	Capacity int
	// WorkspaceRoot holds session workspaces; it must be absolute (it is
	// bind-mounted into the session's container). Required.
	WorkspaceRoot string
	// WarmTTL releases a session durably idle this long; 0 disables it.
	WarmTTL time.Duration
	// CheckpointInterval checkpoints each resident session's workspace
	// that often; 0 only at release.
	CheckpointInterval time.Duration
	// HeartbeatInterval renews leases; the grant's TTL/3 when zero.
	HeartbeatInterval time.Duration
	// Handler handles inbox work; WorkspaceHandler(WorkspaceRoot, InboxAck)
	// when nil.
	Handler residency.Handler
	// InboxAck says when the default handler acks a message: once the
	// session's runtime finished it (AckWhenDone, the default) or once it
	// is written into the workspace (AckWhenWritten).
	InboxAck InboxAck
	// Hooks observe the Manager (tests count consumption with them).
	Hooks residency.Hooks
	// RequestTimeout bounds one request to the control plane's residency
	// services; residency.DefaultRequestTimeout when zero.
	RequestTimeout time.Duration
	// DrainTimeout bounds a drain requested by the control plane; 45 s
	// when zero.
	DrainTimeout time.Duration
}

// Host is a noderuntime.SessionHost over a residency.Manager.
type Host struct {
	o Options

	mu  sync.Mutex
	mgr *residency.Manager
}

var _ noderuntime.SessionHost = (*Host)(nil)

// New validates o.
func New(o Options) (*Host, error) {
	if o.Capacity <= 0 {
		return nil, &residency.InvalidOptionsError{Field: "Capacity", Reason: "must be positive"}
	}
	if !filepath.IsAbs(o.WorkspaceRoot) {
		return nil, &residency.InvalidOptionsError{Field: "WorkspaceRoot", Reason: fmt.Sprintf("%q is not absolute", o.WorkspaceRoot)}
	}
	if err := o.InboxAck.Validate(); err != nil {
		return nil, err
	}
	if o.Handler == nil {
		o.Handler = WorkspaceHandler(o.WorkspaceRoot, o.InboxAck)
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 45 * time.Second
	}
	return &Host{o: o}, nil
}

// Residencies lists what is resident here now (nil before Serve).
func (h *Host) Residencies() []residency.Residency {
	h.mu.Lock()
	m := h.mgr
	h.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Residencies()
}

// Serve implements noderuntime.SessionHost: it hosts sessions until ctx
// ends, then stops as a process exit would (leases lapse at their expiry; a
// graceful stop is a drain first).
func (h *Host) Serve(ctx context.Context, env noderuntime.SessionHostEnv) error {
	log := env.Log.Named("sessions")
	ws, err := residency.NewDirWorkspaces(h.o.WorkspaceRoot)
	if err != nil {
		return err
	}
	ledger, err := residency.NewLedger(h.o.Capacity)
	if err != nil {
		return err
	}
	remote := &residency.Remote{NC: env.Conn.NC, NodeID: env.NodeID, Timeout: h.o.RequestTimeout}
	mgr, err := residency.New(residency.Options{
		HostID: env.NodeID, Logger: log, Admissions: ledger,
		Leases: remote, Locations: remote, Durable: remote, Workspaces: ws,
		Runtime: env.Runtime, Target: h.o.Target, Inboxes: residency.JetStreamInboxes{JS: env.Conn.JS},
		Handler: h.o.Handler, WarmTTL: h.o.WarmTTL, HeartbeatInterval: h.o.HeartbeatInterval, Hooks: h.o.Hooks,
		Checkpoints: func(key residency.Key, epoch residency.ResidencyEpoch) checkpoint.Store {
			return &residency.RemoteCheckpoints{Remote: remote, Key: key, Epoch: epoch}
		},
		CheckpointChunkSize: residency.ChunkSizeFor(env.Conn.NC.MaxPayload()), CheckpointInterval: h.o.CheckpointInterval,
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.mgr = mgr
	h.mu.Unlock()
	s0 := time.Now()
	if n, err := removeLeftovers(ctx, env, h.o.Target.StopGrace, log); err != nil {
		log.Warn("session runtimes of an earlier agent process not all removed", zap.Error(err))
	} else if n > 0 {
		log.Info("removed session runtimes of an earlier agent process", zap.Int("count", n), zap.Duration("took", time.Since(s0)))
	}

	var wg sync.WaitGroup
	s := &server{h: h, mgr: mgr, ledger: ledger, remote: remote, env: env, log: log}
	sub, err := env.Conn.NC.Subscribe(bus.NodeSessions(env.NodeID, "*"), func(m *nats.Msg) {
		wg.Go(func() { s.handle(ctx, m) })
	})
	if err != nil {
		mgr.Close()
		return fmt.Errorf("nodehost: subscribe %s: %w", bus.NodeSessions(env.NodeID, "*"), err)
	}
	log.Info("session host serving", zap.String("compatibility_id", h.o.Target.CompatibilityID), zap.Int("capacity", h.o.Capacity))
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	mgr.Close()
	return nil
}

type server struct {
	h      *Host
	mgr    *residency.Manager
	ledger *residency.Ledger
	remote *residency.Remote
	env    noderuntime.SessionHostEnv
	log    *zap.Logger
}

// handle answers one command on wf.node.<id>.sessions.<op>.
func (s *server) handle(ctx context.Context, m *nats.Msg) {
	op := schemas.SessionOp(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
	rep := schemas.SessionReply{}
	if cmd, err := DecodeCommand(m.Data); err != nil {
		rep.Error = &schemas.SessionError{Code: residency.CodeInvalidRequest, Message: "body is not a SessionCommand: " + err.Error()}
	} else if tok := s.env.FencingToken(); cmd.FencingToken == 0 || cmd.FencingToken != tok {
		rep.Error = &schemas.SessionError{Code: residency.CodeStaleNode,
			Message: fmt.Sprintf("command for fencing token %d; this node's session holds %d", cmd.FencingToken, tok)}
	} else {
		rep = s.do(ctx, op, cmd)
	}
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(rep)
	if err != nil {
		s.log.Error("encode session reply", zap.Error(err))
		return
	}
	if err := m.RespondMsg(&nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{"Content-Type": []string{"application/json"}}}); err != nil {
		s.log.Warn("session reply not sent", zap.String("op", string(op)), zap.Error(err))
	}
}

func (s *server) do(ctx context.Context, op schemas.SessionOp, cmd schemas.SessionCommand) schemas.SessionReply {
	switch op {
	case schemas.SessionAttach:
		r, err := s.attach(ctx, cmd)
		if err != nil {
			return schemas.SessionReply{Error: residency.ToWire(err)}
		}
		v := residency.ViewOf(r)
		return schemas.SessionReply{Residency: &v}
	case schemas.SessionRelease:
		key := residency.KeyOf(cmd.Key())
		if err := key.Validate(); err != nil {
			return schemas.SessionReply{Error: residency.ToWire(err)}
		}
		if err := s.mgr.Release(ctx, key); err != nil {
			return schemas.SessionReply{Error: residency.ToWire(err)}
		}
		return schemas.SessionReply{}
	case schemas.SessionList:
		rs := s.mgr.Residencies()
		out := make([]schemas.ResidencyView, 0, len(rs))
		for _, r := range rs {
			out = append(out, residency.ViewOf(r))
		}
		return schemas.SessionReply{Residencies: out}
	case schemas.SessionDrain:
		dctx, cancel := context.WithTimeout(ctx, s.h.o.DrainTimeout)
		defer cancel()
		rep, err := s.mgr.Drain(dctx)
		v := residency.DrainViewOf(s.env.NodeID, rep)
		if err != nil && len(rep.Failures) == 0 {
			v.Error = residency.ToWire(err)
		}
		s.log.Info("sessions drained", zap.Int("released", len(v.Released)), zap.Int("failures", len(v.Failures)))
		return schemas.SessionReply{Drain: &v}
	default:
		return schemas.SessionReply{Error: &schemas.SessionError{Code: residency.CodeInvalidRequest, Message: "unknown session operation " + string(op)}}
	}
}

// attach attaches cmd's session. A created session's durable record is
// written at once (checkpoint 0) under the new grant, so a successor can
// resume it even if this host never releases it gracefully.
func (s *server) attach(ctx context.Context, cmd schemas.SessionCommand) (residency.Residency, error) {
	key := residency.KeyOf(cmd.Key())
	r, err := s.mgr.Attach(ctx, residency.Request{
		Key: key, Mode: cmd.Mode, CompatibilityID: cmd.CompatibilityID,
		Principal: residency.Principal{TenantID: key.Tenant, ActorID: cmd.Actor, TraceID: cmd.Trace},
		GPUs:      cmd.GPUs, Devices: cmd.Devices, FromCheckpoint: cmd.FromCheckpoint,
	})
	if err != nil || !r.Attached || cmd.Mode != residency.ModeCreate {
		return r, err
	}
	cerr := s.remote.CommitCheckpoint(ctx, residency.Checkpoint{
		Key: residency.WireKey(key), Host: s.env.NodeID, Epoch: r.Epoch, Sequence: 0, CompatibilityID: r.CompatibilityID, Namespace: r.Namespace,
	})
	if cerr != nil {
		// Still resident; the release's checkpoint records it. Until then a
		// successor after a crash finds the journal state unknown.
		s.log.Warn("created session's durable record not written", zap.Stringer("session", key), zap.Error(cerr))
	}
	return r, nil
}

// removeLeftovers removes the session runtimes an earlier process of this
// agent left behind. A fresh host holds no grant: whatever those runtimes
// served lapsed with their process's leases (or will, and then resumes under
// a new epoch), so keeping them would only hold the node's resources.
func removeLeftovers(ctx context.Context, env noderuntime.SessionHostEnv, grace time.Duration, log *zap.Logger) (int, error) {
	ws, err := env.Runtime.List(ctx)
	if err != nil {
		return 0, err
	}
	if grace <= 0 {
		grace = 2 * time.Second
	}
	var errs []error
	n := 0
	for _, w := range ws {
		if !noderuntime.IsSessionWorkload(w) || w.Labels[residency.LabelHost] != env.NodeID {
			continue
		}
		log.Info("removing leftover session runtime", zap.String("workload", w.ID), zap.String("session", w.Labels[residency.LabelSession]))
		if err := env.Runtime.Stop(ctx, w.ID, grace); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			errs = append(errs, fmt.Errorf("stop %s: %w", w.ID, err))
			continue
		}
		if err := env.Runtime.Remove(ctx, w.ID); err != nil && !errors.Is(err, noderuntime.ErrWorkloadNotFound) {
			errs = append(errs, fmt.Errorf("remove %s: %w", w.ID, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// DecodeCommand decodes one session command as the host receives it:
// bounded before decoding, strictly (an unknown field is refused), and
// its every field within the limits on node messages.
func DecodeCommand(data []byte) (schemas.SessionCommand, error) {
	var cmd schemas.SessionCommand
	if err := schemas.DecodeNodeMessage(codec.JSON, data, &cmd); err != nil {
		return schemas.SessionCommand{}, err
	}
	return cmd, nil
}
