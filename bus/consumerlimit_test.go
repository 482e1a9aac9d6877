package bus_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestCmdsStreamTakesMoreThanAThousandConsumers: WF_CMDS holds one
// consumer per node, and nats-server limits a stream with no positive
// max_consumers to 1,000. Provision sets the limit, on a new stream and on
// one provisioned before the limit existed, and the 1,001st consumer is
// created.
func TestCmdsStreamTakesMoreThanAThousandConsumers(t *testing.T) {
	n := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := testenv.Dial(t, n.URL(), "test")

	// The stream as an older version provisioned it: no consumer limit.
	var old jetstream.StreamConfig
	for _, c := range (bus.Topology{}).StreamConfigs() {
		if c.Name == bus.StreamCmds {
			old = c
		}
	}
	if old.MaxConsumers != bus.MaxNodeConsumers {
		t.Fatalf("WF_CMDS max_consumers = %d, want %d", old.MaxConsumers, bus.MaxNodeConsumers)
	}
	old.MaxConsumers = 0
	if _, err := conn.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	s, err := conn.JS.Stream(ctx, bus.StreamCmds)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxConsumers != bus.MaxNodeConsumers {
		t.Fatalf("existing WF_CMDS not updated: max_consumers = %d", info.Config.MaxConsumers)
	}

	// 1,001 node consumers, as enrollment creates them but in memory so
	// the test stays fast.
	const nodes = 1001
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= nodes {
					return
				}
				cfg := bus.NodeConsumerConfig(fmt.Sprintf("n%04d", i), 0)
				cfg.MemoryStorage = true
				if _, err := conn.JS.CreateOrUpdateConsumer(ctx, bus.StreamCmds, cfg); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("consumer %d: %w", i, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	if info, err = s.Info(ctx); err != nil || info.State.Consumers != nodes {
		t.Fatalf("WF_CMDS has %d consumers, want %d (%v)", info.State.Consumers, nodes, err)
	}
}
