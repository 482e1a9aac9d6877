package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/containerd"
	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/noopruntime"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/schemas"
)

// Benchmarks of submit → running, one Run at a time, each after the last
// ended. The no-op runtime isolates warmfleet's own path (NATS, placement,
// two commands, the journal, four reports, every CAS); containerd adds a
// real container start on a warm image. cmd/warmfleet-bench e2e does the
// warm/cold comparison against calling containerd directly. Run with:
//
//	go test -run '^$' -bench . -benchtime 20x ./e2e/
//
// Everything here uses its own helpers (prefixed bench) and testing.TB, so
// the acceptance harness, which takes *testing.T, stays as it is.

// benchPlane is NATS, a control plane and one agent.
type benchPlane struct {
	conn   *bus.Conn
	events chan schemas.RunEvent
}

func startBenchPlane(b *testing.B, rt noderuntime.Runtime, cfg agent.Config) *benchPlane {
	b.Helper()
	n := testenv.StartNATS(b)
	log := zap.NewNop()
	dial := func(name string) *bus.Conn {
		c, err := bus.Connect(n.URL(), name, log)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	cp, err := controlplane.New(ctx, dial("cp"), controlplane.Config{HeartbeatInterval: time.Second, OpenEnrollment: true}, log)
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { _ = cp.Run(ctx) })
	select {
	case <-cp.Ready():
	case <-time.After(30 * time.Second):
		b.Fatal("control plane not ready")
	}
	cfg.DataDir = b.TempDir()
	cfg.Generation = 1
	a, err := agent.New(cfg, dial(cfg.NodeID), rt, log)
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { _ = a.Run(ctx) })
	pl := &benchPlane{conn: dial("producer"), events: make(chan schemas.RunEvent, 1024)}
	kv, err := pl.conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var rec schemas.NodeRecord
		if _, err := bus.GetJSON(ctx, kv, cfg.NodeID, &rec); err == nil && rec.FencingToken != 0 && rec.FencingToken == a.Enrollment().FencingToken {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("agent did not enroll")
		}
	}
	sub, err := pl.conn.NC.Subscribe(bus.SubjectEvents, func(m *nats.Msg) {
		var ev schemas.RunEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == schemas.EventPhase {
			pl.events <- ev
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	return pl
}

// runOnce submits one Run and returns submit → running (this clock) once
// the Run has ended.
func (pl *benchPlane) runOnce(b *testing.B, rid, image string, command []string) time.Duration {
	b.Helper()
	body, err := json.Marshal(schemas.RunRequest{RequestID: rid, Image: image, Command: command,
		Resources: schemas.Resources{CPUMillis: 10, MemoryBytes: 16 << 20}, MaxRuntimeSeconds: 600})
	if err != nil {
		b.Fatal(err)
	}
	m := &nats.Msg{Subject: bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), Data: body, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	t0 := time.Now()
	if _, err := pl.conn.JS.PublishMsg(context.Background(), m, jetstream.WithMsgID(rid)); err != nil {
		b.Fatal(err)
	}
	runID := schemas.RunIDFor(schemas.DefaultTenant, rid)
	var running time.Duration
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev := <-pl.events:
			if ev.RunID != runID {
				continue
			}
			if ev.Phase == schemas.PhaseRunning && running == 0 {
				running = time.Since(t0)
			}
			if ev.Phase.Terminal() {
				if ev.Phase != schemas.PhaseSucceeded {
					b.Fatalf("run %s ended %s: %s", rid, ev.Phase, ev.Message)
				}
				return running
			}
		case <-timeout:
			b.Fatalf("run %s did not end in 60s", rid)
		}
	}
}

func benchReport(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	if len(ds) == 0 {
		return
	}
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(ds[max(0, (len(ds)*99+99)/100-1)].Microseconds())/1000, "p99_ms")
}

// BenchmarkSubmitToRunningNoop is warmfleet's own path, no container.
func BenchmarkSubmitToRunningNoop(b *testing.B) {
	digest := "sha256:" + fmt.Sprintf("%064x", 7)
	rt := noopruntime.New(noopruntime.Options{Images: []string{digest}, ExitAfter: 10 * time.Millisecond})
	pl := startBenchPlane(b, rt, agent.Config{NodeID: "bench-noop", Capacity: schemas.Resources{CPUMillis: 64_000, MemoryBytes: 64 << 30}})
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	pl.runOnce(b, "bench-noop-warmup-"+nonce, "localhost/bench@"+digest, []string{"true"})
	var ds []time.Duration
	i := 0
	for b.Loop() {
		i++
		ds = append(ds, pl.runOnce(b, fmt.Sprintf("bench-noop-%s-%d", nonce, i), "localhost/bench@"+digest, []string{"true"}))
	}
	benchReport(b, ds)
}

// BenchmarkSubmitToRunningContainerd is a real container start on a warm
// image (imported by an untimed first Run). It skips where containerd,
// runc, busybox-static or root are missing, as the acceptance tests do.
func BenchmarkSubmitToRunningContainerd(b *testing.B) {
	ctrd := testenv.StartContainerd(b)
	dir := b.TempDir()
	img := testenv.BuildBusyboxImage(b, dir, "busybox")
	bridge := testenv.NewBridge(b)
	rt, err := containerd.New(context.Background(), containerd.Options{Address: ctrd.Address, Namespace: ctrd.Namespace, ImageDir: dir,
		LogDir: filepath.Join(dir, "logs"), StateDir: filepath.Join(dir, "runtime"),
		Network: containerd.NetworkOptions{Bridge: bridge.Name, Subnet: bridge.Subnet}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Close() })
	pl := startBenchPlane(b, rt, agent.Config{NodeID: "bench-ctrd", ContentRoot: ctrd.Root, StopGrace: 2 * time.Second})
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	pl.runOnce(b, "bench-ctrd-warmup-"+nonce, img.Reference, []string{"true"})
	var ds []time.Duration
	i := 0
	for b.Loop() {
		i++
		ds = append(ds, pl.runOnce(b, fmt.Sprintf("bench-ctrd-%s-%d", nonce, i), img.Reference, []string{"true"}))
	}
	benchReport(b, ds)
}
