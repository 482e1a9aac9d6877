package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// partition is a TCP proxy between one agent and NATS that a test can cut
// (every connection closed, new ones refused) and heal.
type partition struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func newPartition(t *testing.T, natsURL string) *partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, upstream: strings.TrimPrefix(natsURL, "nats://")}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.sever()
		p.wg.Wait()
	})
	return p
}

func (p *partition) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *partition) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// sever closes every proxied connection and refuses new ones.
func (p *partition) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *partition) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// TestResidencyPartition_SurrenderAndFencedLateWrites: node A is cut off
// from NATS while a session is resident on it and its process keeps
// running. Nobody tells A anything: its heartbeat cannot renew, the grant
// lapses at A's local deadline (before the control plane's expiry), and A
// surrenders — it stops consuming and tears the session's runtime down. B
// attaches under epoch 2; when the partition heals, A's late writes under
// epoch 1 are refused and the route stays B's. No inbox message is lost; at
// most the one A held at the cut (MaxAckPending 1) is handled again, by B
// under the new epoch, because A's ack could not reach the server.
func TestResidencyPartition_SurrenderAndFencedLateWrites(t *testing.T) {
	f := sessionFleet(t)
	l := newLedger(t)
	part := newPartition(t, f.nats.URL())
	rtA := noopruntime.New(noopruntime.Options{})
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: rtA, ledger: l, url: part.URL()})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", ledger: l})
	key := residency.Key{Tenant: "acme", Session: "part-1"}

	r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id})
	if r.Host != a.id || r.Epoch != 1 {
		t.Fatalf("attach: %+v", r)
	}
	const total = 25
	published := make(chan []string)
	go func() {
		var ids []string
		for i := range total {
			id := fmt.Sprintf("p-%02d", i)
			ids = append(ids, id)
			f.publishWork(key, id)
			time.Sleep(200 * time.Millisecond)
		}
		published <- ids
	}()
	f.eventually(15*time.Second, "node-a processing", func() bool { return l.count() >= 3 })

	part.sever()
	cutAt := time.Now()
	f.eventually(15*time.Second, "node-a to surrender on its own", func() bool {
		return len(a.host.Residencies()) == 0
	})
	if st, err := rtA.Inspect(context.Background(), r.Workload); err == nil && st.State == noderuntime.WorkloadRunning {
		t.Errorf("node-a's session runtime still running after surrender: %+v", st)
	}
	t.Logf("node-a surrendered %s after the cut", time.Since(cutAt).Round(time.Millisecond))

	rb := f.attachWhenLeaseFree(key, 20*time.Second, "node-b to attach")
	if rb.Host != b.id || rb.Epoch != 2 {
		t.Fatalf("failover: %+v, want node-b at epoch 2", rb)
	}

	part.heal()
	f.eventually(15*time.Second, "node-a to reconnect", func() bool {
		b, _ := json.Marshal(schemas.SessionCommand{FencingToken: a.agent.Enrollment().FencingToken})
		_, err := f.conn.NC.Request(bus.NodeSessions(a.id, string(schemas.SessionList)), b, time.Second)
		return err == nil
	})
	late := &residency.Remote{NC: f.conn.NC, NodeID: a.id, Timeout: 5 * time.Second}
	ctx := context.Background()
	if err := late.PublishResidency(ctx, residency.Observation{Tenant: key.Tenant, Session: key.Session, Host: a.id, Epoch: 1,
		State: residency.StateResident, Accepting: true, ObservedAt: time.Now()}); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("late publish: %v, want ErrEpochSuperseded", err)
	}
	if err := late.TombstoneResidency(ctx, key, a.id, 1); !errors.Is(err, residency.ErrEpochSuperseded) {
		t.Errorf("late tombstone: %v, want ErrEpochSuperseded", err)
	}
	if o, _ := f.route(key); o.Host != b.id || o.Epoch != 2 || o.State != residency.StateResident {
		t.Fatalf("route after heal: %+v, want node-b resident at epoch 2", o)
	}

	ids := <-published
	f.eventually(30*time.Second, "every message processed", func() bool { return l.count() == total })
	time.Sleep(500 * time.Millisecond)
	twice := 0
	for _, id := range ids {
		h := l.handled(id)
		switch {
		case len(h) == 1 && (h[0] == "node-a@1" || h[0] == "node-b@2"):
		case len(h) == 2 && h[0] == "node-a@1" && h[1] == "node-b@2":
			twice++ // in flight on A at the cut; its ack never arrived
		default:
			t.Errorf("message %s handled %v", id, h)
		}
	}
	if twice > 1 {
		t.Errorf("%d messages handled by both hosts; at most the one in flight at the cut may be", twice)
	}
	l.checkNoOverlap()
}
