package controlplane

import (
	"context"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// provisionedBus starts an embedded NATS with warmfleet's streams and
// buckets, and connects to it as name until the test ends.
func provisionedBus(t *testing.T, name string) *bus.Conn {
	t.Helper()
	n := testenv.StartNATS(t)
	conn, err := bus.Connect(n.URL(), name, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := bus.Provision(context.Background(), conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	return conn
}
