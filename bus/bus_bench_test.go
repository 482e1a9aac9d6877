package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// These are the floors the control plane's figures are compared with
// (cmd/warmfleet-bench reports the same baselines in its runs; see
// docs/benchmarks.md). Run with:
//
//	go test -run '^$' -bench . -benchtime 2s ./bus/

func benchConn(b *testing.B) *bus.Conn {
	b.Helper()
	return testenv.Dial(b, testenv.StartNATS(b).URL(), "bench")
}

// BenchmarkJetStreamPublishAck is intake's baseline: publish-with-ack of a
// RunRequest-sized payload, with a Nats-Msg-Id, into a work-queue file
// stream with WF_RUNS's dedupe window; one publish in flight.
func BenchmarkJetStreamPublishAck(b *testing.B) {
	c := benchConn(b)
	ctx := context.Background()
	if _, err := c.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.raw"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 400)
	b.SetBytes(int64(len(payload)))
	i := 0
	for b.Loop() {
		i++
		if _, err := c.JS.PublishMsg(ctx, &nats.Msg{Subject: "bench.raw", Data: payload}, jetstream.WithMsgID("m-"+strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkCoreRequestReply is the command round trip's baseline: core
// request/reply of a command-sized payload, responder on its own
// connection, one request in flight.
func BenchmarkCoreRequestReply(b *testing.B) {
	c := benchConn(b)
	resp, err := nats.Connect(c.NC.ConnectedUrl())
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Close()
	if _, err := resp.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		b.Fatal(err)
	}
	if err := resp.Flush(); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 350)
	for b.Loop() {
		if _, err := c.NC.Request("bench.echo", payload, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateJSON is one CAS cycle of bus.UpdateJSON (get, decode,
// mutate, encode, update) on a node record, which is what every heartbeat
// costs the control plane today. "bare" has no facts; "facts" carries a GPU
// host's facts with 8 images, as the fleet bench's simulated nodes report.
func BenchmarkUpdateJSON(b *testing.B) {
	for _, withFacts := range []bool{false, true} {
		name := "bare"
		if withFacts {
			name = "facts"
		}
		b.Run(name, func(b *testing.B) {
			c := benchConn(b)
			ctx := context.Background()
			if err := bus.Provision(ctx, c.JS, bus.Topology{}); err != nil {
				b.Fatal(err)
			}
			kv, err := c.JS.KeyValue(ctx, bus.BucketNodes)
			if err != nil {
				b.Fatal(err)
			}
			rec := schemas.NodeRecord{NodeID: "n1", Generation: 1, FencingToken: 1, State: schemas.NodeReady}
			if withFacts {
				f := benchFacts(8)
				rec.Facts = &f
			}
			raw, _ := json.Marshal(rec)
			if _, err := bus.CreateJSON(ctx, kv, "n1", &rec); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, _, err := bus.UpdateJSON(ctx, kv, "n1", func(n *schemas.NodeRecord) error {
					n.LeaseExpires = time.Now().Add(5 * time.Second)
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
		})
	}
}

// BenchmarkDecodeNodeRecord is the JSON decode a heartbeat pays twice (in
// UpdateJSON, and again in the control plane's KV watch), without NATS.
func BenchmarkDecodeNodeRecord(b *testing.B) {
	f := benchFacts(8)
	raw, err := json.Marshal(schemas.NodeRecord{NodeID: "n1", Generation: 1, FencingToken: 1, State: schemas.NodeReady, Facts: &f})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		var n schemas.NodeRecord
		if err := json.Unmarshal(raw, &n); err != nil {
			b.Fatal(err)
		}
	}
}

func benchFacts(images int) schemas.NodeFacts {
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
