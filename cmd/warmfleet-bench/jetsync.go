package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
)

// jetSyncOpts are the jetsync subcommand's flags.
type jetSyncOpts struct {
	msgs, size, producers, rounds int
}

func newJetSyncCmd(g *globals) *cobra.Command {
	o := &jetSyncOpts{}
	cmd := &cobra.Command{
		Use:   "jetsync",
		Short: "Acknowledged JetStream publishes with sync_interval: always vs the server's default (fsync every 2 minutes)",
		Long: `jetsync starts an embedded JetStream server with a file store twice per
round, once with sync_interval: always (every write fsynced before it is
acknowledged) and once with the default (acknowledged at once, flushed to
disk every two minutes), and publishes the same messages into a one-replica
stream on each: one producer waiting for each ack (rate and p50 latency),
then --producers at once (rate). The rounds alternate the two settings; each
figure is the median over rounds, against the default as its baseline.`,
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runJetSync(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.msgs, "msgs", 2000, "messages published per setting and shape")
	f.IntVar(&o.size, "size", 512, "bytes per message (a node report is a few hundred)")
	f.IntVar(&o.producers, "producers", 16, "concurrent producers in the second shape")
	f.IntVar(&o.rounds, "rounds", 3, "rounds, each measuring both settings")
	return cmd
}

// jetSyncSample is one setting's figures in one round.
type jetSyncSample struct {
	Always      bool    `json:"sync_always"`
	SerialRate  float64 `json:"serial_per_s"`
	SerialP50MS float64 `json:"serial_p50_ms"`
	SerialP99MS float64 `json:"serial_p99_ms"`
	ParallelHz  float64 `json:"parallel_per_s"`
}

func runJetSync(ctx context.Context, g *globals, o *jetSyncOpts) (*Report, error) {
	if o.msgs < 1 || o.size < 1 || o.producers < 1 || o.rounds < 1 {
		return nil, fmt.Errorf("--msgs, --size, --producers and --rounds must be positive")
	}
	dir, err := os.MkdirTemp(g.storeDir, "warmfleet-bench-jetsync-")
	if err != nil {
		return nil, err
	}
	if !g.keep {
		defer os.RemoveAll(dir)
	}
	var samples []jetSyncSample
	for r := range o.rounds {
		// Alternate which setting goes first, so drift favours neither.
		for i := range 2 {
			always := (r+i)%2 == 0
			s, err := jetSyncRound(ctx, filepath.Join(dir, fmt.Sprintf("r%d-%v", r, always)), always, o)
			if err != nil {
				return nil, fmt.Errorf("round %d, sync always %v: %w", r+1, always, err)
			}
			samples = append(samples, s)
		}
	}
	pick := func(always bool, f func(jetSyncSample) float64) float64 {
		var xs []float64
		for _, s := range samples {
			if s.Always == always {
				xs = append(xs, f(s))
			}
		}
		return median(xs)
	}
	rep := newReport("jetsync")
	rep.add("acked publishes/s, 1 producer, sync_interval: always", pick(true, func(s jetSyncSample) float64 { return s.SerialRate }), "msg/s",
		pick(false, func(s jetSyncSample) float64 { return s.SerialRate }), "default sync (2m)")
	rep.add("publish → ack p50, 1 producer, sync_interval: always", pick(true, func(s jetSyncSample) float64 { return s.SerialP50MS }), "ms",
		pick(false, func(s jetSyncSample) float64 { return s.SerialP50MS }), "default sync (2m)")
	rep.add("publish → ack p99, 1 producer, sync_interval: always", pick(true, func(s jetSyncSample) float64 { return s.SerialP99MS }), "ms",
		pick(false, func(s jetSyncSample) float64 { return s.SerialP99MS }), "default sync (2m)")
	rep.add(fmt.Sprintf("acked publishes/s, %d producers, sync_interval: always", o.producers), pick(true, func(s jetSyncSample) float64 { return s.ParallelHz }), "msg/s",
		pick(false, func(s jetSyncSample) float64 { return s.ParallelHz }), "default sync (2m)")
	rep.note("%d messages of %d bytes per setting and shape, one-replica file stream, %d rounds alternating the settings; medians over rounds", o.msgs, o.size, o.rounds)
	rep.Details["samples"] = samples
	return rep, nil
}

// jetSyncRound starts a server on storeDir with the setting, measures both
// shapes and stops it.
func jetSyncRound(ctx context.Context, storeDir string, always bool, o *jetSyncOpts) (jetSyncSample, error) {
	s := jetSyncSample{Always: always}
	srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: storeDir, Port: -1, SyncAlways: always})
	if err != nil {
		return s, err
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return s, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return s, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JETSYNC", Subjects: []string{"jetsync.>"}, Storage: jetstream.FileStorage, Replicas: 1}); err != nil {
		return s, err
	}
	payload := make([]byte, o.size)
	lat := make([]time.Duration, 0, o.msgs)
	start := time.Now()
	for range o.msgs {
		t0 := time.Now()
		if _, err := js.Publish(ctx, "jetsync.serial", payload); err != nil {
			return s, err
		}
		lat = append(lat, time.Since(t0))
	}
	s.SerialRate = float64(o.msgs) / time.Since(start).Seconds()
	l := summarise(lat)
	s.SerialP50MS, s.SerialP99MS = l.P50, l.P99
	s.ParallelHz, err = jetSyncParallel(ctx, js, payload, o)
	return s, err
}

// jetSyncParallel publishes o.msgs messages from o.producers goroutines,
// each waiting for its acks, and returns the rate.
func jetSyncParallel(ctx context.Context, js jetstream.JetStream, payload []byte, o *jetSyncOpts) (float64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, o.producers)
	start := time.Now()
	for p := range o.producers {
		n := o.msgs / o.producers
		if p < o.msgs%o.producers {
			n++
		}
		wg.Go(func() {
			for range n {
				if _, err := js.Publish(ctx, "jetsync.parallel", payload); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(o.msgs) / time.Since(start).Seconds(), nil
}
