package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// newFleetSimCmd is the fleet bench's simulated agents: one goroutine and
// one NATS connection each. A simulated agent enrolls on wf.enroll (open
// enrollment), heartbeats on wf.node.<id>.heartbeat at the interval its
// enrollment names, and publishes facts on wf.node.<id>.obs every
// --facts-interval. It consumes no commands (none are sent). Hidden: fleet
// starts it.
func newFleetSimCmd() *cobra.Command {
	var o simOpts
	cmd := &cobra.Command{
		Use:    "fleet-sim",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := fleetSim(o)
			if err != nil {
				emit(map[string]any{"event": "error", "msg": err.Error()})
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "nats-url", "", "NATS server")
	f.IntVar(&o.n, "n", 100, "simulated agents")
	f.StringVar(&o.prefix, "prefix", "sim", "node id prefix")
	f.IntVar(&o.images, "images", 8, "images each node reports in its facts")
	f.DurationVar(&o.factsEvery, "facts-interval", 30*time.Second, "how often each node reports facts")
	f.IntVar(&o.concurrency, "enroll-concurrency", 32, "enrollments in flight at once")
	return cmd
}

type simOpts struct {
	url         string
	n           int
	prefix      string
	images      int
	factsEvery  time.Duration
	concurrency int
}

type simAgent struct {
	id     string
	nc     *nats.Conn
	token  uint64
	every  time.Duration
	stop   chan struct{}
	lastHB atomic.Int64 // unix nanos of the last heartbeat sent
}

func fleetSim(o simOpts) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agents := make([]*simAgent, o.n)
	var (
		wg       sync.WaitGroup
		sem      = make(chan struct{}, max(o.concurrency, 1))
		errOnce  sync.Once
		firstErr error
		retries  atomic.Int64
	)
	var (
		hbSent    atomic.Int64
		factsSent atomic.Int64
		loops     sync.WaitGroup
	)
	start := time.Now()
	for i := range o.n {
		wg.Go(func() {
			sem <- struct{}{}
			a, r, err := enrollSim(ctx, o, i)
			<-sem
			retries.Add(int64(r))
			if err != nil {
				errOnce.Do(func() { firstErr = err })
				return
			}
			agents[i] = a
			// Heartbeat from enrollment on, as an agent does: a node that
			// waited for the whole fleet would lapse while others enroll.
			loops.Go(func() { a.run(ctx, o, &hbSent, &factsSent) })
		})
	}
	wg.Wait()
	if firstErr != nil {
		cancel()
		loops.Wait()
		return firstErr
	}
	enrolled := time.Since(start)
	emit(map[string]any{"event": "enrolled", "count": o.n, "seconds": enrolled.Seconds(), "retries": retries.Load()})

	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch verb {
		case "stop": // stop K: the last K agents stop heartbeating
			k, _ := strconv.Atoi(arg)
			k = min(max(k, 0), len(agents))
			var stopped []map[string]any
			for _, a := range agents[len(agents)-k:] {
				close(a.stop)
			}
			// Each loop exits within a tick of the close; read lastHB after.
			time.Sleep(50 * time.Millisecond)
			for _, a := range agents[len(agents)-k:] {
				stopped = append(stopped, map[string]any{"id": a.id, "last_heartbeat_unix_nano": a.lastHB.Load()})
			}
			emit(map[string]any{"event": "stopped", "nodes": stopped})
		case "stats":
			emit(map[string]any{"event": "stats", "heartbeats_sent": hbSent.Load(), "facts_sent": factsSent.Load()})
		}
	}
	cancel()
	loops.Wait()
	for _, a := range agents {
		a.nc.Close()
	}
	return nil
}

// enrollSim connects and enrolls one simulated agent, retrying an
// unanswered request (the control plane serialises enrollments, so a burst
// of thousands queues).
func enrollSim(ctx context.Context, o simOpts, i int) (*simAgent, int, error) {
	id := fmt.Sprintf("%s-%05d", o.prefix, i)
	// A loaded server answers slowly: a generous timeout, and retries.
	var nc *nats.Conn
	var err error
	for try := 0; ; try++ {
		nc, err = nats.Connect(o.url, nats.Name(id), nats.MaxReconnects(-1), nats.Timeout(10*time.Second))
		if err == nil {
			break
		}
		if try >= 5 || ctx.Err() != nil {
			return nil, 0, fmt.Errorf("%s: connect: %w", id, err)
		}
	}
	req := schemas.EnrollmentRequest{NodeID: id, Generation: 1, AgentVersion: "bench-sim",
		Capacity: schemas.Resources{CPUMillis: 32_000, MemoryBytes: 256 << 30, GPUCount: 8}, Facts: simFacts(o.images, i)}
	b, err := codec.Encode(codec.MsgPack, req)
	if err != nil {
		return nil, 0, err
	}
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := nc.RequestWithContext(rctx, bus.SubjectEnroll, b)
		cancel()
		if err != nil {
			if try >= 10 {
				nc.Close()
				return nil, try, fmt.Errorf("%s: enroll: %w", id, err)
			}
			continue
		}
		var rep schemas.Reply[schemas.Enrollment]
		if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
			nc.Close()
			return nil, try, fmt.Errorf("%s: enrollment reply: %w", id, err)
		}
		if rep.OK == nil {
			nc.Close()
			return nil, try, fmt.Errorf("%s: enrollment refused: %v", id, rep.Refusal)
		}
		return &simAgent{id: id, nc: nc, token: rep.OK.FencingToken, every: time.Duration(max(rep.OK.HeartbeatSeconds, 1)) * time.Second,
			stop: make(chan struct{})}, try, nil
	}
}

// run heartbeats and reports facts until ctx ends or the agent is stopped.
// Both start at a random phase, so a fleet's reports spread over time.
func (a *simAgent) run(ctx context.Context, o simOpts, hbSent, factsSent *atomic.Int64) {
	hb := time.NewTimer(rand.N(a.every))
	defer hb.Stop()
	facts := time.NewTimer(rand.N(o.factsEvery))
	defer facts.Stop()
	seq := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.stop:
			return
		case <-hb.C:
			hb.Reset(a.every)
			b, err := codec.Encode(codec.MsgPack, schemas.Heartbeat{NodeID: a.id, FencingToken: a.token, SentAt: time.Now()})
			if err == nil && a.nc.Publish(bus.NodeHeartbeat(a.id), b) == nil {
				a.lastHB.Store(time.Now().UnixNano())
				hbSent.Add(1)
			}
		case <-facts.C:
			facts.Reset(o.factsEvery)
			seq++
			f := simFacts(o.images, seq)
			b, err := codec.Encode(codec.MsgPack, schemas.Observation{NodeID: a.id, FencingToken: a.token, Generation: 1, Kind: schemas.ObsFacts, Facts: &f})
			if err == nil && a.nc.Publish(bus.NodeObs(a.id), b) == nil {
				factsSent.Add(1)
			}
		}
	}
}

// simFacts is a GPU host holding `images` images of five layers each.
func simFacts(images, seed int) schemas.NodeFacts {
	now := time.Now()
	f := schemas.NodeFacts{ObservedAt: now, Host: schemas.HostFacts{
		OS: "linux", Architecture: "amd64", KernelVersion: "6.1.0-bench", ContainerRuntime: "containerd", RuntimeVersion: "1.7.24",
		CPUMillis: 32_000, MemoryBytes: 256 << 30,
		Accelerator: schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54.15", DriverCapability: "12.4",
			Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 8}}},
		Disk: schemas.DiskFacts{Known: true, TotalBytes: 2 << 40, FreeBytes: 1 << 40},
	}}
	for i := range images {
		im := schemas.ImageLocality{ManifestDigest: benchDigest(fmt.Sprintf("image-%d", (seed+i)%64)),
			Platform: schemas.Platform{OS: "linux", Architecture: "amd64"}, ContentPresent: true, State: schemas.LocalityHot, LastVerifiedAt: now}
		for l := range 5 {
			im.LayerDigests = append(im.LayerDigests, benchDigest(fmt.Sprintf("layer-%d-%d", (seed+i)%64, l)))
			im.LayerSizes = append(im.LayerSizes, int64(50_000_000*(l+1)))
		}
		f.Images = append(f.Images, im)
	}
	f.Caches = []schemas.CacheFact{{Name: "weights", CompatibilityKey: "v1", SizeBytes: 10 << 30, LastUsedAt: now}}
	return f
}
