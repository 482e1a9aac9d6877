package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/checkpoint"
)

// checkpointOpts are the checkpoint subcommand's flags.
type checkpointOpts struct {
	sizeMiB, files, changedMiB, rounds int
}

func newCheckpointCmd(g *globals) *cobra.Command {
	o := &checkpointOpts{}
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Session checkpoint and restore MiB/s against raw object store put and get, and an incremental checkpoint's bytes",
		Long: `checkpoint writes a workspace of --files random (incompressible) files,
--size-mib in all, and starts an embedded JetStream server with a file store.
Each round then puts the files into an object store bucket one after
another (nats.go's ObjectStore.Put) and reads them back to disk
(ObjectStore.Get): the raw baseline. It takes a checkpoint of the same
workspace into the same bucket (residency/checkpoint.Take, a fresh session)
and restores it into an empty directory (Restore). Last, it overwrites
--changed-mib in one file and takes an incremental checkpoint after the
round's first: the bytes it moved against those changed. Figures are
medians over rounds.`,
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runCheckpointBench(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.sizeMiB, "size-mib", 1024, "the workspace's size")
	f.IntVar(&o.files, "files", 16, "files the workspace holds, of equal size")
	f.IntVar(&o.changedMiB, "changed-mib", 10, "bytes overwritten in one file before the incremental checkpoint")
	f.IntVar(&o.rounds, "rounds", 3, "rounds")
	return cmd
}

// checkpointSample is one round's figures.
type checkpointSample struct {
	RawPutMiBs     float64 `json:"raw_put_mib_s"`
	RawGetMiBs     float64 `json:"raw_get_mib_s"`
	TakeMiBs       float64 `json:"take_mib_s"`
	RestoreMiBs    float64 `json:"restore_mib_s"`
	IncrMovedBytes int64   `json:"incremental_moved_bytes"`
	IncrSeconds    float64 `json:"incremental_s"`
}

func runCheckpointBench(ctx context.Context, g *globals, o *checkpointOpts) (*Report, error) {
	if o.sizeMiB < 1 || o.files < 1 || o.rounds < 1 || o.changedMiB < 1 || o.changedMiB > o.sizeMiB/o.files {
		return nil, fmt.Errorf("--size-mib, --files, --rounds and --changed-mib must be positive, --changed-mib at most one file's size")
	}
	dir, err := os.MkdirTemp(g.storeDir, "warmfleet-bench-checkpoint-")
	if err != nil {
		return nil, err
	}
	if !g.keep {
		defer os.RemoveAll(dir)
	}
	ws := filepath.Join(dir, "workspace")
	if err := writeWorkspace(ws, o); err != nil {
		return nil, err
	}
	prof, err := newProfiler(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer prof.close()
	if err := prof.start(); err != nil {
		return nil, err
	}
	var samples []checkpointSample
	for r := range o.rounds {
		s, err := checkpointRound(ctx, dir, ws, r, o)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", r+1, err)
		}
		samples = append(samples, s)
	}
	return checkpointReport(samples, o), nil
}

func checkpointReport(samples []checkpointSample, o *checkpointOpts) *Report {
	pick := func(f func(checkpointSample) float64) float64 {
		xs := make([]float64, len(samples))
		for i, s := range samples {
			xs[i] = f(s)
		}
		return median(xs)
	}
	rep := newReport("checkpoint")
	take := rep.add(fmt.Sprintf("checkpoint of a %d MiB workspace", o.sizeMiB), pick(func(s checkpointSample) float64 { return s.TakeMiBs }), "MiB/s",
		pick(func(s checkpointSample) float64 { return s.RawPutMiBs }), "raw object store put")
	take.goal("≥ 0.8× raw", take.Ratio >= 0.8)
	restore := rep.add(fmt.Sprintf("restore of a %d MiB workspace", o.sizeMiB), pick(func(s checkpointSample) float64 { return s.RestoreMiBs }), "MiB/s",
		pick(func(s checkpointSample) float64 { return s.RawGetMiBs }), "raw object store get")
	restore.goal("≥ 0.8× raw", restore.Ratio >= 0.8)
	moved := pick(func(s checkpointSample) float64 { return float64(s.IncrMovedBytes) / (1 << 20) })
	rep.add(fmt.Sprintf("incremental checkpoint after %d MiB changed", o.changedMiB), moved, "MiB moved", float64(o.changedMiB), "bytes changed").
		goal("about the bytes changed (≤ 1.5×)", moved <= 1.5*float64(o.changedMiB))
	rep.note("%d random files; the checkpoint as a node takes it, through the control plane's checkpoint service (residency.RemoteCheckpoints, %d KiB chunks) into wf_checkpoints, a one-replica file-store bucket on this machine's disk; raw put is the files one after another into the same bucket, raw get reads each back to disk; every phase starts after a sync(2); medians over %d rounds", o.files, residency.ChunkSize>>10, o.rounds)
	rep.Details["samples"] = samples
	return rep
}

// writeWorkspace fills ws with o.files random files.
func writeWorkspace(ws string, o *checkpointOpts) error {
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{34, 35})
	size := int64(o.sizeMiB) << 20 / int64(o.files)
	for i := range o.files {
		f, err := os.Create(filepath.Join(ws, fmt.Sprintf("file-%03d", i)))
		if err != nil {
			return err
		}
		_, err = io.CopyN(f, rng, size)
		if err = errors.Join(err, f.Close()); err != nil {
			return err
		}
	}
	return nil
}

// checkpointRound starts a JetStream server and the control plane's
// session services of its own, so no round writes into a store an
// earlier one filled, and measures a round there.
func checkpointRound(ctx context.Context, dir, ws string, r int, o *checkpointOpts) (checkpointSample, error) {
	store := filepath.Join(dir, fmt.Sprintf("nats-%d", r))
	defer os.RemoveAll(store)
	srv, err := bus.StartEmbedded(bus.EmbeddedOptions{StoreDir: store, Port: -1})
	if err != nil {
		return checkpointSample{}, err
	}
	defer srv.Shutdown()
	cp, err := startCheckpointService(ctx, srv.URL())
	if err != nil {
		return checkpointSample{}, err
	}
	defer cp.close()
	return cp.round(ctx, dir, ws, r, o)
}

// round measures the raw baseline, then a checkpoint, a restore and an
// incremental checkpoint as a node takes them (RemoteCheckpoints through
// the control plane), each timed from a sync(2).
func (cp *checkpointService) round(ctx context.Context, dir, ws string, r int, o *checkpointOpts) (checkpointSample, error) {
	var s checkpointSample
	mib := float64(o.sizeMiB)
	raw := fmt.Sprintf("raw-%d/", r)
	put, get, err := rawPutGet(ctx, cp.obs, ws, raw, filepath.Join(dir, raw))
	if err != nil {
		return s, err
	}
	s.RawPutMiBs, s.RawGetMiBs = mib/put, mib/get
	key := residency.Key{Tenant: "bench", Session: fmt.Sprintf("round-%d", r)}
	store, err := cp.holder(ctx, key)
	if err != nil {
		return s, err
	}
	opt := checkpoint.Options{ChunkSize: residency.ChunkSize}
	id := checkpoint.ID{Sequence: 1, Epoch: uint64(store.Epoch)}
	syscall.Sync()
	start := time.Now()
	first, _, err := checkpoint.Take(ctx, ws, store, id, opt)
	if err != nil {
		return s, err
	}
	s.TakeMiBs = mib / time.Since(start).Seconds()
	dst := filepath.Join(dir, fmt.Sprintf("restored-%d", r))
	syscall.Sync()
	start = time.Now()
	if _, _, err := checkpoint.Restore(ctx, store, id, dst, 0); err != nil {
		return s, err
	}
	s.RestoreMiBs = mib / time.Since(start).Seconds()
	if err := os.RemoveAll(dst); err != nil {
		return s, err
	}
	if err := overwrite(filepath.Join(ws, "file-000"), int64(o.changedMiB)<<20, uint64(r)); err != nil {
		return s, err
	}
	opt.Previous = &first
	syscall.Sync()
	start = time.Now()
	_, st, err := checkpoint.Take(ctx, ws, store, checkpoint.ID{Sequence: 2, Epoch: id.Epoch}, opt)
	if err != nil {
		return s, err
	}
	s.IncrSeconds, s.IncrMovedBytes = time.Since(start).Seconds(), st.BytesMoved
	return s, nil
}

// rawPutGet puts every file of ws as an object named prefix+file, one
// after another, then reads each back into out; it returns the seconds
// each took.
func rawPutGet(ctx context.Context, obs jetstream.ObjectStore, ws, prefix, out string) (put, get float64, err error) {
	entries, err := os.ReadDir(ws)
	if err != nil {
		return 0, 0, err
	}
	syscall.Sync()
	start := time.Now()
	for _, e := range entries {
		f, err := os.Open(filepath.Join(ws, e.Name()))
		if err != nil {
			return 0, 0, err
		}
		_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: prefix + e.Name()}, f)
		if err = errors.Join(err, f.Close()); err != nil {
			return 0, 0, err
		}
	}
	put = time.Since(start).Seconds()
	if err := os.MkdirAll(out, 0o700); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(out)
	syscall.Sync()
	start = time.Now()
	for _, e := range entries {
		if err := getTo(ctx, obs, prefix+e.Name(), filepath.Join(out, e.Name())); err != nil {
			return 0, 0, err
		}
	}
	return put, time.Since(start).Seconds(), nil
}

func getTo(ctx context.Context, obs jetstream.ObjectStore, name, path string) error {
	res, err := obs.Get(ctx, name)
	if err != nil {
		return err
	}
	defer res.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, res)
	return errors.Join(err, f.Close())
}

// overwrite replaces n bytes in the middle of the file at p with new
// random ones.
func overwrite(p string, n int64, seed uint64) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	info, err := f.Stat()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	_, err = io.Copy(io.NewOffsetWriter(f, (info.Size()-n)/2), io.LimitReader(rand.NewChaCha8([32]byte{byte(seed), 1}), n))
	return errors.Join(err, f.Close())
}
