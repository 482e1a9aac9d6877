package main

import (
	"context"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/tenantread"
)

// serveReads serves the tenant read services on conn until t ends, as the
// control plane does.
func serveReads(t *testing.T, conn *bus.Conn) {
	t.Helper()
	kv, err := conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop, err := tenantread.New(conn, kv, nil, zap.NewNop()).Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); cancel(); wg.Wait() })
}

// asEachReader runs test as the operator, who reads JetStream, and as a
// producer of the default tenant, who reads through the tenant's
// runs.* services: both see the same bytes.
func asEachReader(t *testing.T, test func(t *testing.T)) {
	for _, who := range []string{bus.OperatorUser, "p1"} {
		t.Run(who, func(t *testing.T) {
			if who != bus.OperatorUser {
				t.Setenv(bus.EnvNATSInboxName, who)
			}
			test(t)
		})
	}
}
