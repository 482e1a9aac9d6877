package main

import (
	"context"
	"fmt"
	"io"
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
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runArtifactBench(ctx, g, o) }),
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
	// nats.go bounds an object Get by its default timeout when ctx has no
	// deadline, which a large object outlasts.
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	e, err := newEnv(g, "artifact")
	if err != nil {
		return nil, err
	}
	defer e.close()
	b, err := newArtifactBench(ctx, e, int64(o.mib)<<20)
	if err != nil {
		return nil, err
	}
	raws, stores, err := b.rounds(ctx, o.rounds)
	if err != nil {
		return nil, err
	}
	warm, err := b.warmUse(ctx)
	if err != nil {
		return nil, err
	}
	return b.report(o, raws, stores, warm), nil
}

// artifactBench is one object in the artifact bucket of a fresh NATS, and
// what fetching it takes.
type artifactBench struct {
	dir     string
	conn    *bus.Conn
	obs     jetstream.ObjectStore
	object  string
	digest  string
	size    int64
	putTook time.Duration
}

// newArtifactBench provisions the bucket and puts size incompressible
// bytes into it.
func newArtifactBench(ctx context.Context, e *env, size int64) (*artifactBench, error) {
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
	var key [32]byte
	key[0] = 7
	start := time.Now()
	st, err := putRandom(ctx, conn.NC, "bench/weights", size, key)
	if err != nil {
		return nil, err
	}
	return &artifactBench{dir: e.dir, conn: conn, obs: obs, object: st.Name, digest: st.Digest, size: size, putTook: time.Since(start)}, nil
}

// rounds times n fetches each side, alternating which goes first.
func (b *artifactBench) rounds(ctx context.Context, n int) (raws, stores []float64, err error) {
	for i := range n {
		first, second := b.raw, b.store
		if i%2 == 1 {
			first, second = b.store, b.raw
		}
		x, err := first(ctx, i)
		if err != nil {
			return nil, nil, err
		}
		y, err := second(ctx, i)
		if err != nil {
			return nil, nil, err
		}
		if i%2 == 1 {
			x, y = y, x
		}
		raws, stores = append(raws, x.Seconds()), append(stores, y.Seconds())
	}
	return raws, stores, nil
}

// raw is what `nats object get` does: nats.go's object Get copied into a
// file (not synced).
func (b *artifactBench) raw(ctx context.Context, i int) (time.Duration, error) {
	path := filepath.Join(b.dir, fmt.Sprintf("raw-%d", i))
	defer os.Remove(path)
	start := time.Now()
	r, err := b.obs.Get(ctx, b.object)
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

// store is an Ensure into an empty replica store.
func (b *artifactBench) store(ctx context.Context, i int) (time.Duration, error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("store-%d", i))
	defer os.RemoveAll(dir)
	s, err := artifactstore.New(dir)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	res, err := s.Ensure(ctx, artifactstore.Want{Digest: b.digest, SizeBytes: b.size, Source: b.source()})
	if err != nil {
		return 0, err
	}
	if res.FetchedBytes != b.size {
		return 0, fmt.Errorf("store fetched %d bytes of %d", res.FetchedBytes, b.size)
	}
	return time.Since(start), nil
}

func (b *artifactBench) source() artifactstore.Source {
	return artifactstore.OwnObjectReads(b.conn.JS, bus.ObjectBucketArtifacts, b.object, b.digest)
}

// warmUse is an Ensure with the replica present: it re-verifies it and
// fetches nothing.
type warmUse struct {
	cold, warm *countingSource
	fetched    int64
	took       time.Duration
}

func (b *artifactBench) warmUse(ctx context.Context) (warmUse, error) {
	s, err := artifactstore.New(filepath.Join(b.dir, "warm"))
	if err != nil {
		return warmUse{}, err
	}
	w := warmUse{cold: &countingSource{Source: b.source()}, warm: &countingSource{Source: b.source()}}
	if _, err := s.Ensure(ctx, artifactstore.Want{Digest: b.digest, SizeBytes: b.size, Source: w.cold}); err != nil {
		return w, err
	}
	start := time.Now()
	res, err := s.Ensure(ctx, artifactstore.Want{Digest: b.digest, SizeBytes: b.size, Source: w.warm})
	if err != nil {
		return w, err
	}
	w.took, w.fetched = time.Since(start), res.FetchedBytes
	return w, nil
}

func (b *artifactBench) report(o artifactOpts, raws, stores []float64, warm warmUse) *Report {
	mibps := func(sec float64) float64 { return float64(b.size) / (1 << 20) / sec }
	rawMed, storeMed := median(raws), median(stores)
	ratio := rawMed / storeMed
	met := ratio >= 0.9
	zero := warm.warm.bytes.Load() == 0 && warm.warm.opens.Load() == 0 && warm.fetched == 0
	return &Report{Bench: "artifact", Machine: machine(), Command: fmt.Sprintf("warmfleet-bench artifact --mib %d --rounds %d", o.mib, o.rounds),
		Rows: []Row{
			{Figure: "object store → replica store (median)", Value: mibps(storeMed), Unit: "MiB/s", Baseline: mibps(rawMed), BaseName: "nats object get into a file (median)", BaseUnit: "MiB/s",
				Ratio: ratio, Goal: "≥ 0.9", Met: &met},
			{Figure: "warm use: bytes fetched", Value: float64(warm.warm.bytes.Load()), Unit: "bytes", Goal: "0", Met: &zero},
			{Figure: "warm use: re-verification", Value: ms(warm.took), Unit: "ms"},
		},
		Details: map[string]any{"size_bytes": b.size, "raw_seconds": raws, "store_seconds": stores, "put_seconds": b.putTook.Seconds(),
			"cold_fetched_bytes": warm.cold.bytes.Load(), "warm_source_opens": warm.warm.opens.Load()},
	}
}
