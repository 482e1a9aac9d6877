package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/nodehost"
	"github.com/warmfleet/warmfleet/schemas"
)

// Session residency end to end: a real control plane (residency services
// over wf_leases, wf_residency and wf_sessions), real agents hosting
// sessions through residency/nodehost, and real WF_INBOX consumers.

const (
	noopImage  = "example.com/session@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	noopDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	sessCompat = "session-build@1"
)

func sessionFleet(t *testing.T) *fleet {
	return newFleet(t, func(c *controlplane.Config) {
		c.Sessions = sessions.Config{LeaseTTL: 3 * time.Second, InboxAckWait: 5 * time.Second,
			AttachTimeout: 30 * time.Second, DrainTimeout: 20 * time.Second}
	})
}

// bulkSessionFleet is sessionFleet for tests that move hundreds of MiB of
// workspace through the control plane: leases of the control plane's
// default 15 s, and attach and release replies awaited for minutes. Under
// the race detector every byte copied is checked, and on 2 cores such a
// checkpoint runs at about 10 MiB/s: long enough to outlast a 3 s lease's
// renewals and a 20 s reply.
func bulkSessionFleet(t *testing.T) *fleet {
	return newFleet(t, func(c *controlplane.Config) {
		c.Sessions = sessions.Config{LeaseTTL: 15 * time.Second, InboxAckWait: 5 * time.Second,
			AttachTimeout: 4 * time.Minute, DrainTimeout: 4 * time.Minute}
	})
}

// ledger records every inbox message a session host handled, and who was
// consuming each session's inbox when: the acceptance tests' ground truth.
type ledger struct {
	t  *testing.T
	mu sync.Mutex
	// done maps message id → each (host, epoch) that handled it.
	done map[string][]string
	// consuming maps session → host currently consuming its inbox.
	consuming map[residency.Key]string
	overlaps  []string
	// handedBack maps message id → each (host, epoch) that handed it back
	// unfinished when consumption stopped.
	handedBack map[string][]string
	// deliveries maps message id → the highest delivery count seen.
	deliveries map[string]uint64
}

func newLedger(t *testing.T) *ledger {
	return &ledger{t: t, done: map[string][]string{}, consuming: map[residency.Key]string{},
		handedBack: map[string][]string{}, deliveries: map[string]uint64{}}
}

func (l *ledger) handled(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.done[id]...)
}

// returned is each (host, epoch) that handed id back unfinished.
func (l *ledger) returned(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.handedBack[id]...)
}

// delivered is the highest delivery count id was handled under.
func (l *ledger) delivered(id string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deliveries[id]
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// hooks and handler for one host.
func (l *ledger) hooks(host string) residency.Hooks {
	return residency.Hooks{OnConsume: func(k residency.Key, e residency.ResidencyEpoch, on bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		cur, busy := l.consuming[k]
		switch {
		case on && busy:
			l.overlaps = append(l.overlaps, fmt.Sprintf("%s: %s began consuming (epoch %d) while %s was", k, host, e, cur))
		case on:
			l.consuming[k] = host
		case cur == host:
			delete(l.consuming, k)
		}
	}}
}

// handler delivers through the production WorkspaceHandler and records the
// delivery once it succeeded under a held grant, and work handed back
// unfinished. ack is the handler's mode: a node runtime that runs nothing
// (noopruntime) finishes no work, so those tests ack once it is written.
func (l *ledger) handler(host, root string, ack nodehost.InboxAck) residency.Handler {
	deliver := nodehost.WorkspaceHandler(root, ack)
	return func(ctx context.Context, w residency.Work) error {
		err := deliver(ctx, w)
		who := fmt.Sprintf("%s@%d", host, w.Guard.Epoch())
		l.mu.Lock()
		defer l.mu.Unlock()
		l.deliveries[w.MsgID] = max(l.deliveries[w.MsgID], w.Delivered)
		switch {
		case err == nil:
			l.done[w.MsgID] = append(l.done[w.MsgID], who)
		case errors.Is(err, residency.ErrWorkUnfinished):
			l.handedBack[w.MsgID] = append(l.handedBack[w.MsgID], who)
		}
		return err
	}
}

func (l *ledger) checkNoOverlap() {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.overlaps {
		l.t.Errorf("two hosts consumed one inbox at once: %s", o)
	}
}

// sessionNode is an agent hosting sessions.
type sessionNode struct {
	id    string
	agent *agent.Agent
	host  *nodehost.Host
	rt    noderuntime.Runtime
	ws    string
	part  *part
}

type sessionNodeSpec struct {
	id      string
	rt      noderuntime.Runtime // the node runtime; a noopruntime when nil
	target  residency.RuntimeTarget
	warmTTL time.Duration
	ledger  *ledger
	// url is the NATS URL the agent dials; the fleet's server when empty
	// (a partition test puts a cuttable proxy in between).
	url string
	// accelerator states the node's cards.
	accelerator agent.AcceleratorProbe
	// checkpointInterval checkpoints resident sessions that often (0:
	// only at release).
	checkpointInterval time.Duration
	// ackWhenDone acks inbox work once the session's runtime finished it
	// (the agent's default); otherwise once it is written.
	ackWhenDone bool
}

func (f *fleet) startSessionNode(spec sessionNodeSpec) *sessionNode {
	f.t.Helper()
	if spec.rt == nil {
		spec.rt = noopruntime.New(noopruntime.Options{})
	}
	if spec.target.Image == "" {
		spec.target = residency.RuntimeTarget{Image: noopImage, ManifestDigest: noopDigest, CompatibilityID: sessCompat, StopGrace: 100 * time.Millisecond}
	}
	dataDir := tempDir(f.t)
	ws := filepath.Join(dataDir, "sessions")
	ack := nodehost.AckWhenWritten
	if spec.ackWhenDone {
		ack = nodehost.AckWhenDone
	}
	host, err := nodehost.New(nodehost.Options{
		Target: spec.target, Capacity: 8, WorkspaceRoot: ws, WarmTTL: spec.warmTTL, CheckpointInterval: spec.checkpointInterval,
		Handler: spec.ledger.handler(spec.id, ws, ack), Hooks: spec.ledger.hooks(spec.id), RequestTimeout: 3 * time.Second,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	url := spec.url
	if url == "" {
		url = f.nats.URL()
	}
	conn, err := bus.Connect(url, spec.id, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	a, err := agent.New(agent.Config{NodeID: spec.id, Generation: 1, DataDir: dataDir, StopGrace: 2 * time.Second, Sessions: host, Accelerator: spec.accelerator},
		conn, spec.rt, f.log.Named(spec.id))
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := newPart(cancel, func() error { defer conn.Close(); return a.Run(ctx) })
	f.t.Cleanup(func() { p.stop(f.t) })
	f.waitNode(spec.id, a)
	// The session host subscribes once the agent has enrolled.
	f.eventually(10*time.Second, spec.id+"'s session host answering", func() bool {
		b, _ := json.Marshal(schemas.SessionCommand{FencingToken: a.Enrollment().FencingToken})
		resp, err := f.conn.NC.Request(bus.NodeSessions(spec.id, string(schemas.SessionList)), b, time.Second)
		if err != nil {
			return false
		}
		var rep schemas.SessionReply
		return json.Unmarshal(resp.Data, &rep) == nil && rep.Error == nil
	})
	return &sessionNode{id: spec.id, agent: a, host: host, rt: spec.rt, ws: ws, part: p}
}

// containerdRuntime is a real containerd runtime in w for node id.
func (f *fleet) containerdRuntime(w world, id string) *containerd.Runtime {
	f.t.Helper()
	rt, err := containerd.New(context.Background(), w.runtimeOptions(tempDir(f.t), f.log.Named(id+"-ctrd")))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = rt.Close() })
	return rt
}

// sessionAdmin sends an operator's session request, as the CLI does.
func (f *fleet) sessionAdmin(subject string, req schemas.SessionRequest) schemas.SessionReply {
	f.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	resp, err := f.conn.NC.RequestWithContext(ctx, subject, b)
	if err != nil {
		f.t.Fatalf("%s: %v", subject, err)
	}
	var rep schemas.SessionReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		f.t.Fatalf("%s reply: %v", subject, err)
	}
	return rep
}

// attachSession attaches through the control plane and fails on an error.
func (f *fleet) attachSession(req schemas.SessionRequest) schemas.ResidencyView {
	f.t.Helper()
	rep := f.sessionAdmin(bus.SubjectSessionAttach, req)
	if rep.Error != nil || rep.Residency == nil {
		f.t.Fatalf("attach %s.%s: %v", req.Tenant, req.Session, rep.Error)
	}
	return *rep.Residency
}

// attachWhenLeaseFree attaches key through the control plane, retrying while
// the previous holder's lease is still live (lease_held) and failing on any
// other refusal; it gives up after within.
func (f *fleet) attachWhenLeaseFree(key residency.Key, within time.Duration, what string) schemas.ResidencyView {
	f.t.Helper()
	var rv schemas.ResidencyView
	f.eventually(within, what, func() bool {
		rep := f.sessionAdmin(bus.SubjectSessionAttach, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session})
		if rep.Error != nil {
			if rep.Error.Code != residency.CodeLeaseHeld {
				f.t.Fatalf("%s: %v", what, rep.Error)
			}
			time.Sleep(250 * time.Millisecond)
			return false
		}
		rv = *rep.Residency
		return true
	})
	return rv
}

// askHost sends a session command straight to a node's host (bypassing the
// control plane's placement), stamped with the node's current token.
func (f *fleet) askHost(n *sessionNode, op schemas.SessionOp, cmd schemas.SessionCommand) schemas.SessionReply {
	f.t.Helper()
	cmd.FencingToken = n.agent.Enrollment().FencingToken
	b, _ := json.Marshal(cmd)
	resp, err := f.conn.NC.Request(bus.NodeSessions(n.id, string(op)), b, 20*time.Second)
	if err != nil {
		f.t.Fatalf("%s %s: %v", n.id, op, err)
	}
	var rep schemas.SessionReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		f.t.Fatal(err)
	}
	return rep
}

func (f *fleet) route(key residency.Key) (residency.Observation, bool) {
	f.t.Helper()
	var o residency.Observation
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketResidency)
	if err != nil {
		f.t.Fatal(err)
	}
	_, err = bus.GetJSON(context.Background(), kv, key.String(), &o)
	return o, err == nil
}

func (f *fleet) leaseRecord(key residency.Key) (residency.LeaseRecord, bool) {
	var l residency.LeaseRecord
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketLeases)
	if err != nil {
		f.t.Fatal(err)
	}
	_, err = bus.GetJSON(context.Background(), kv, key.String(), &l)
	return l, err == nil
}

func (f *fleet) sessionRecord(key residency.Key) (residency.SessionRecord, bool) {
	var s residency.SessionRecord
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketSessions)
	if err != nil {
		f.t.Fatal(err)
	}
	_, err = bus.GetJSON(context.Background(), kv, key.String(), &s)
	return s, err == nil
}

// publishWork puts one message in a session's inbox, deduplicated on id.
func (f *fleet) publishWork(key residency.Key, id string) {
	f.t.Helper()
	m := &nats.Msg{Subject: key.InboxSubject(), Data: []byte(`{"work":"` + id + `"}`), Header: nats.Header{}}
	if _, err := f.conn.JS.PublishMsg(context.Background(), m, jetstream.WithMsgID(id)); err != nil {
		f.t.Fatalf("publish %s: %v", id, err)
	}
}

// sessionEvents reads key's events stored in WF_EVENTS, in order.
func (f *fleet) sessionEvents(key residency.Key) []schemas.SessionEvent {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := f.conn.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.SessionEventsSubject(key.Tenant, key.Session)}})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []schemas.SessionEvent
	for {
		m, err := c.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return out
		}
		var ev schemas.SessionEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			f.t.Fatalf("session event %q: %v", m.Data(), err)
		}
		out = append(out, ev)
	}
}

func sortedKeys(ks []schemas.SessionKey) []string {
	out := make([]string, 0, len(ks))
	for _, k := range ks {
		out = append(out, residency.KeyOf(k).String())
	}
	sort.Strings(out)
	return out
}
