package testenv

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"go.uber.org/zap"
)

// NATS is an embedded nats-server with JetStream owned by one test.
type NATS struct {
	*bus.Embedded
	// StoreDir is the JetStream file store; a restarted server given the
	// same dir keeps every stream and bucket.
	StoreDir string
	port     int
}

// StartNATS starts an embedded JetStream server on a random loopback port
// with its file store in a temp dir, and shuts it down when t ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	dir, err := os.MkdirTemp("", "wfnats")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n := &NATS{StoreDir: dir, port: -1}
	n.start(t)
	return n
}

func (n *NATS) start(t testing.TB) {
	t.Helper()
	e, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: n.StoreDir, Port: n.port})
	if err != nil {
		t.Fatalf("testenv: start nats: %v", err)
	}
	n.Embedded = e
	if a, ok := e.Server().Addr().(*net.TCPAddr); ok {
		n.port = a.Port // a restart comes back on the same port
	}
	t.Cleanup(func() {
		if n.Embedded == e {
			e.Shutdown()
		}
	})
}

// Restart shuts the server down and starts it again on the same port and
// store, as an operator restarting nats-server would.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Embedded.Shutdown()
	n.start(t)
}

// Dial connects to url as name, waits until connected, and closes the
// connection when t ends.
func Dial(t testing.TB, url, name string) *bus.Conn {
	t.Helper()
	c, err := bus.Connect(url, name, zap.NewNop())
	if err != nil {
		t.Fatalf("testenv: connect %s: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		c.Close()
		t.Fatalf("testenv: connect %s: %v", name, err)
	}
	t.Cleanup(c.Close)
	return c
}

// ProvisionedBus starts an embedded NATS with warmfleet's streams and
// buckets, and connects to it as name until t ends.
func ProvisionedBus(t testing.TB, name string) *bus.Conn {
	t.Helper()
	conn := Dial(t, StartNATS(t).URL(), name)
	if err := bus.Provision(context.Background(), conn.JS, bus.Topology{}); err != nil {
		t.Fatalf("testenv: provision: %v", err)
	}
	return conn
}
