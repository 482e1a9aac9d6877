package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// Benchmarks of the control plane through its public subjects, each with its
// baseline measured in the same benchmark on the same server. cmd/warmfleet-bench
// runs the longer versions; docs/benchmarks.md has the figures. Run with:
//
//	go test -run '^$' -bench . -benchtime 2000x ./controlplane/

type benchPlane struct {
	conn *bus.Conn // the producer's connection
	cp   *controlplane.ControlPlane
}

func startBenchPlane(b *testing.B, cfg controlplane.Config) *benchPlane {
	b.Helper()
	n := testenv.StartNATS(b)
	cpConn := testenv.Dial(b, n.URL(), "cp") // closed after the control plane stops (cleanups run last-in first)
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.New(ctx, cpConn, cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	select {
	case <-cp.Ready():
	case err := <-done:
		b.Fatalf("control plane stopped: %v", err)
	case <-time.After(30 * time.Second):
		b.Fatal("control plane not ready")
	}
	prod := testenv.Dial(b, n.URL(), "producer")
	return &benchPlane{conn: prod, cp: cp}
}

func benchRequest(id string) schemas.RunRequest {
	return schemas.RunRequest{RequestID: id, Image: "localhost/bench@sha256:" + strings.Repeat("ab", 32),
		Command: []string{"sh", "-c", "echo hello from warmfleet-bench"}, Env: map[string]string{"BENCH": "1"},
		Resources: schemas.Resources{CPUMillis: 10, MemoryBytes: 16 << 20}, Labels: map[string]string{"team": "bench"}, MaxRuntimeSeconds: 600}
}

// publishAll publishes n messages from p producers, each one in flight.
func publishAll(b *testing.B, js jetstream.JetStream, p, n int, msg func(i int) *nats.Msg) time.Duration {
	b.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range p {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := js.PublishMsg(context.Background(), msg(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkIntake: b.N Runs submitted by 1, 4 or 16 producers until each
// one's accepted event is out (the Run is in WF_RUNS, wf_runs and
// WF_EVENTS). Baseline: the same producers publishing the same bytes with
// ack to a plain work-queue file stream on the same server. No node is
// enrolled, so Runs wait in accepted. Metrics: runs/s, baseline_msgs/s,
// ratio (runs/s ÷ baseline).
func BenchmarkIntake(b *testing.B) {
	for _, p := range []int{1, 4, 16} {
		b.Run("producers="+strconv.Itoa(p), func(b *testing.B) {
			pl := startBenchPlane(b, controlplane.Config{WaitForCapacity: true})
			ctx := context.Background()
			nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
			body := func(i int) []byte {
				bs, err := json.Marshal(benchRequest(fmt.Sprintf("b-%s-%08d", nonce, i)))
				if err != nil {
					b.Fatal(err)
				}
				return bs
			}
			sample := body(0)
			if _, err := pl.conn.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw"},
				Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
				b.Fatal(err)
			}
			var accepted atomic.Int64
			all := make(chan struct{})
			sub, err := pl.conn.NC.Subscribe(bus.SubjectEvents, func(m *nats.Msg) {
				if bytes.Contains(m.Data, []byte(`"seq":1,"type":"accepted"`)) && accepted.Add(1) == int64(b.N) {
					close(all)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			_ = sub.SetPendingLimits(-1, -1)
			if err := pl.conn.NC.Flush(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			base := publishAll(b, pl.conn.JS, p, b.N, func(i int) *nats.Msg {
				m := &nats.Msg{Subject: "bench.raw", Data: sample, Header: nats.Header{}}
				m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
				m.Header.Set(jetstream.MsgIDHeader, "raw-"+strconv.Itoa(i))
				return m
			})
			start := time.Now()
			publishAll(b, pl.conn.JS, p, b.N, func(i int) *nats.Msg {
				m := &nats.Msg{Subject: bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), Data: body(i), Header: nats.Header{}}
				m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("b-%s-%08d", nonce, i))
				return m
			})
			select {
			case <-all:
			case <-time.After(2*time.Minute + time.Duration(b.N)*time.Millisecond):
				b.Fatalf("%d of %d Runs accepted", accepted.Load(), b.N)
			}
			runs := float64(b.N) / time.Since(start).Seconds()
			baseline := float64(b.N) / base.Seconds()
			b.StopTimer()
			_ = sub.Unsubscribe()
			b.ReportMetric(runs, "runs/s")
			b.ReportMetric(baseline, "baseline_msgs/s")
			b.ReportMetric(runs/baseline, "ratio")
		})
	}
}

// BenchmarkHeartbeats: nodes enrolled on wf.enroll (open enrollment), then
// b.N heartbeats published round-robin as fast as the connection takes
// them; the time is until the control plane has counted each one as a
// lease extension (Metrics().Heartbeats). It shows the ceiling on
// heartbeats per second, hence on fleet size at a given heartbeat
// interval. Baseline: a plain subscriber on its own connection receiving
// the same b.N heartbeats. nodes_writes/heartbeat is the wf_nodes writes
// per heartbeat (0: leases live in memory).
// "images=0" nodes report bare host facts; "images=8" nodes report 8 images
// of 5 layers each, as the fleet bench's simulated nodes do, which makes
// each wf_nodes record about 6 KB (it was decoded and encoded per heartbeat
// before leases moved to memory).
func BenchmarkHeartbeats(b *testing.B) {
	for _, images := range []int{0, 8} {
		b.Run("images="+strconv.Itoa(images), func(b *testing.B) { benchHeartbeats(b, images) })
	}
}

func benchHeartbeats(b *testing.B, images int) {
	const nodes = 50
	pl := startBenchPlane(b, controlplane.Config{HeartbeatInterval: time.Hour, OpenEnrollment: true, WaitForCapacity: true})
	ctx := context.Background()
	tokens := make([]uint64, nodes)
	for i := range nodes {
		req := schemas.EnrollmentRequest{NodeID: fmt.Sprintf("hb-%03d", i), Generation: 1, AgentVersion: "bench",
			Capacity: schemas.Resources{CPUMillis: 1000, MemoryBytes: 1 << 30}, Facts: benchNodeFacts(images)}
		data, err := codec.Encode(codec.MsgPack, req)
		if err != nil {
			b.Fatal(err)
		}
		m, err := pl.conn.NC.Request(bus.SubjectEnroll, data, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var rep schemas.Reply[schemas.Enrollment]
		if err := codec.Decode(codec.Detect(m.Header, m.Data), m.Data, &rep); err != nil || rep.OK == nil {
			b.Fatalf("enroll: %v %+v", err, rep.Refusal)
		}
		tokens[i] = rep.OK.FencingToken
	}
	kvStream, err := pl.conn.JS.Stream(ctx, "KV_"+bus.BucketNodes)
	if err != nil {
		b.Fatal(err)
	}
	lastSeq := func() uint64 {
		info, err := kvStream.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return info.State.LastSeq
	}
	beats := make([][]byte, nodes)
	for i := range nodes {
		beats[i], _ = codec.Encode(codec.MsgPack, schemas.Heartbeat{NodeID: fmt.Sprintf("hb-%03d", i), FencingToken: tokens[i], SentAt: time.Now()})
	}
	// Baseline: a bare subscriber.
	var got atomic.Int64
	done := make(chan struct{})
	sub, err := pl.conn.NC.Subscribe("bench.hb.*", func(*nats.Msg) {
		if got.Add(1) == int64(b.N) {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = pl.conn.NC.Flush()
	b.ResetTimer()
	t0 := time.Now()
	for i := range b.N {
		_ = pl.conn.NC.Publish("bench.hb."+strconv.Itoa(i%nodes), beats[i%nodes])
	}
	<-done
	baseline := float64(b.N) / time.Since(t0).Seconds()
	_ = sub.Unsubscribe()

	seq0, hb0 := lastSeq(), pl.cp.Metrics().Heartbeats
	t0 = time.Now()
	for i := range b.N {
		_ = pl.conn.NC.Publish(bus.NodeHeartbeat(fmt.Sprintf("hb-%03d", i%nodes)), beats[i%nodes])
	}
	_ = pl.conn.NC.Flush()
	deadline := time.Now().Add(2*time.Minute + time.Duration(b.N)*5*time.Millisecond)
	for pl.cp.Metrics().Heartbeats-hb0 < int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("the control plane took %d of %d heartbeats", pl.cp.Metrics().Heartbeats-hb0, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	rate := float64(b.N) / time.Since(t0).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(lastSeq()-seq0)/float64(b.N), "nodes_writes/heartbeat")
	b.ReportMetric(rate, "heartbeats/s")
	b.ReportMetric(baseline, "baseline_msgs/s")
	b.ReportMetric(rate/baseline, "ratio")
}

func benchNodeFacts(images int) schemas.NodeFacts {
	now := time.Now()
	f := schemas.NodeFacts{ObservedAt: now, Host: schemas.HostFacts{OS: "linux", Architecture: "amd64", CPUMillis: 32_000, MemoryBytes: 256 << 30,
		Accelerator: schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverCapability: "12.4",
			Devices: []schemas.AcceleratorDevice{{Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, Count: 8}}},
		Disk: schemas.DiskFacts{Known: true, TotalBytes: 2 << 40, FreeBytes: 1 << 40}}}
	for i := range images {
		im := schemas.ImageLocality{ManifestDigest: fmt.Sprintf("sha256:%064x", i), Platform: schemas.Platform{OS: "linux", Architecture: "amd64"},
			ContentPresent: true, State: schemas.LocalityHot, LastVerifiedAt: now}
		for l := range 5 {
			im.LayerDigests = append(im.LayerDigests, fmt.Sprintf("sha256:%064x", 1000*i+l))
			im.LayerSizes = append(im.LayerSizes, int64(50_000_000*(l+1)))
		}
		f.Images = append(f.Images, im)
	}
	return f
}
