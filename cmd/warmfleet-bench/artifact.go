package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
)

type artifactOpts struct {
	mib    int
	rounds int
}

func newArtifactCmd(g *globals) *cobra.Command {
	o := artifactOpts{}
	cmd := &cobra.Command{
		Use:   "artifact",
		Short: "Fetching an artifact from the object store into the replica store vs a raw object get",
		Long: `artifact puts --mib of incompressible bytes into the artifact object store
bucket of an embedded NATS on loopback, then, --rounds times, alternating
which goes first:

  raw    what ` + "`nats object get`" + ` does: nats.go's object Get copied into a
         file (not synced)
  store  agent/artifactstore's Ensure into an empty replica store: the
         object source, sha256 while writing, verification, the rename

The ratio is raw time / store time (≥ 0.9 is the goal). Then a warm Ensure
(the replica present) is timed: it must fetch 0 bytes and open no source;
its time is the re-verification every use pays.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runArtifactBench(cmd.Context(), g, o)
			if err != nil {
				return err
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.mib, "mib", 2048, "artifact size in MiB")
	f.IntVar(&o.rounds, "rounds", 3, "timed fetches each side")
	return cmd
}

// countingSource counts the opens and bytes a Source serves.
type countingSource struct {
	artifactstore.Source
	opens, bytes atomic.Int64
}

func (c *countingSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	c.opens.Add(1)
	rc, err := c.Source.Open(ctx, offset)
	if err != nil {
		return nil, err
	}
	return countingReader{rc, &c.bytes}, nil
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n.Add(int64(n))
	return n, err
}

func runArtifactBench(ctx context.Context, g *globals, o artifactOpts) (*Report, error) {
	if o.mib <= 0 || o.rounds <= 0 {
		return nil, fmt.Errorf("--mib and --rounds must be positive")
	}
	// nats.go bounds an object Get or Put by its default timeout when ctx
	// has no deadline, which a large object outlasts.
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	e, err := newEnv(g, "artifact")
	if err != nil {
		return nil, err
	}
	defer e.close()
	conn, err := e.connect("bench")
	if err != nil {
		return nil, err
	}
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		return nil, err
	}
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		return nil, err
	}
	size := int64(o.mib) << 20
	var key [32]byte
	key[0] = 7
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8(key), size), h)
	const object = "bench/weights"
	putStart := time.Now()
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: object}, src); err != nil {
		return nil, fmt.Errorf("put %d MiB: %w", o.mib, err)
	}
	putTook := time.Since(putStart)
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))

	raw := func(i int) (time.Duration, error) {
		path := filepath.Join(e.dir, fmt.Sprintf("raw-%d", i))
		defer os.Remove(path)
		start := time.Now()
		r, err := obs.Get(ctx, object)
		if err != nil {
			return 0, err
		}
		defer r.Close()
		f, err := os.Create(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			return 0, err
		}
		if err := f.Close(); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	store := func(i int) (time.Duration, error) {
		dir := filepath.Join(e.dir, fmt.Sprintf("store-%d", i))
		defer os.RemoveAll(dir)
		s, err := artifactstore.New(dir)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		res, err := s.Ensure(ctx, artifactstore.Want{Digest: digest, SizeBytes: size, Source: artifactstore.NewObjectSource(conn.JS, bus.ObjectBucketArtifacts, object, digest)})
		if err != nil {
			return 0, err
		}
		if res.FetchedBytes != size {
			return 0, fmt.Errorf("store fetched %d bytes of %d", res.FetchedBytes, size)
		}
		return time.Since(start), nil
	}
	var raws, stores []float64
	for i := range o.rounds {
		first, second := raw, store
		if i%2 == 1 {
			first, second = store, raw
		}
		a, err := first(i)
		if err != nil {
			return nil, err
		}
		b, err := second(i)
		if err != nil {
			return nil, err
		}
		if i%2 == 1 {
			a, b = b, a
		}
		raws, stores = append(raws, a.Seconds()), append(stores, b.Seconds())
	}

	// Warm: the replica is present; a use re-verifies it and fetches nothing.
	warmDir := filepath.Join(e.dir, "warm")
	s, err := artifactstore.New(warmDir)
	if err != nil {
		return nil, err
	}
	cold := &countingSource{Source: artifactstore.NewObjectSource(conn.JS, bus.ObjectBucketArtifacts, object, digest)}
	if _, err := s.Ensure(ctx, artifactstore.Want{Digest: digest, SizeBytes: size, Source: cold}); err != nil {
		return nil, err
	}
	warm := &countingSource{Source: artifactstore.NewObjectSource(conn.JS, bus.ObjectBucketArtifacts, object, digest)}
	warmStart := time.Now()
	res, err := s.Ensure(ctx, artifactstore.Want{Digest: digest, SizeBytes: size, Source: warm})
	if err != nil {
		return nil, err
	}
	warmTook := time.Since(warmStart)

	mibps := func(sec float64) float64 { return float64(size) / (1 << 20) / sec }
	rawMed, storeMed := median(raws), median(stores)
	ratio := rawMed / storeMed
	met := ratio >= 0.9
	zero := warm.bytes.Load() == 0 && warm.opens.Load() == 0 && res.FetchedBytes == 0
	rep := &Report{Bench: "artifact", Machine: machine(), Command: fmt.Sprintf("warmfleet-bench artifact --mib %d --rounds %d", o.mib, o.rounds),
		Rows: []Row{
			{Figure: "object store → replica store (median)", Value: mibps(storeMed), Unit: "MiB/s", Baseline: mibps(rawMed), BaseName: "nats object get into a file (median)", BaseUnit: "MiB/s",
				Ratio: ratio, Goal: "≥ 0.9", Met: &met},
			{Figure: "warm use: bytes fetched", Value: float64(warm.bytes.Load()), Unit: "bytes", Goal: "0", Met: &zero},
			{Figure: "warm use: re-verification", Value: ms(warmTook), Unit: "ms"},
		},
		Details: map[string]any{"size_bytes": size, "raw_seconds": raws, "store_seconds": stores, "put_seconds": putTook.Seconds(),
			"cold_fetched_bytes": cold.bytes.Load(), "warm_source_opens": warm.opens.Load()},
	}
	return rep, nil
}
