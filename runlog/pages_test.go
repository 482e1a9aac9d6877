package runlog_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/tenantread"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// servePages serves the tenant read services on conn until t ends.
func servePages(t *testing.T, conn *bus.Conn) {
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

// tenantChunk stores a chunk of tenant's Run runID as a node does.
func tenantChunk(t *testing.T, js jetstream.JetStream, tenant, runID string, attempt int, stream string, off int64, at time.Time, data string) {
	t.Helper()
	id := runlogAttempt(runID, attempt)
	m := &nats.Msg{Subject: bus.RunLogsSubject(tenant, runID), Data: []byte(data), Header: nats.Header{bus.HeaderLogAttempt: {id},
		bus.HeaderLogStream: {stream}, bus.HeaderLogOffset: {strconv.FormatInt(off, 10)}, bus.HeaderLogTime: {at.Format(time.RFC3339Nano)}, bus.HeaderLogNode: {"n1"}}}
	if _, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(bus.LogMsgID(id, stream, off))); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, src runlog.Source, o runlog.Options) []runlog.Line {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []runlog.Line
	if err := runlog.ReadFrom(ctx, src, o, func(l runlog.Line) error { out = append(out, l); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPagesReadAsTheStream: a producer's read through its tenant's
// runs.read pages yields exactly what the stream's reader yields, for
// every option, over more chunks than one page holds; another tenant's
// output of a Run of the same id is not among them.
func TestPagesReadAsTheStream(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	servePages(t, conn)
	t0 := time.Now().Add(-time.Hour).UTC()
	off := int64(0)
	for i := range 2*schemas.MaxReadMessages + 7 {
		text := fmt.Sprintf("line %d\n", i)
		if i%50 == 0 {
			text = fmt.Sprintf("split %d ", i) // joined with the next chunk's bytes
		}
		tenantChunk(t, conn.JS, "a", "r-1", 1+i/400, bus.LogStdout, off, t0.Add(time.Duration(i)*time.Second), text)
		off += int64(len(text))
		if i == 399 {
			off = 0 // attempt 2 starts its own stream
		}
		if i%100 == 0 {
			tenantChunk(t, conn.JS, "a", "r-1", 1, bus.LogStderr, int64(i/100), t0.Add(time.Duration(i)*time.Second), "e")
		}
	}
	tenantChunk(t, conn.JS, "b", "r-1", 1, bus.LogStdout, 0, t0, "b's\n")

	stream := runlog.StreamSource(conn.JS, bus.StreamLogs, bus.RunLogsSubject("a", "r-1"))
	pages := runlog.PageSource(conn.NC, "a", schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-1"})
	for _, o := range []runlog.Options{
		{},
		{Tail: 5},
		{Tail: 300, Stream: bus.LogStdout},
		{Since: t0.Add(200 * time.Second)},
		{Attempt: runlogAttempt("r-1", 2)},
		{Stream: bus.LogStderr},
	} {
		want, got := readAll(t, stream, o), readAll(t, pages, o)
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Fatalf("options %+v: pages read %d lines, the stream %d:\n%v\nwant\n%v", o, len(got), len(want), tailOf(got), tailOf(want))
		}
		for _, l := range got {
			if l.Text == "b's" {
				t.Fatalf("tenant b's output read as a's")
			}
		}
	}

	// Follow: new output as it comes, until Done.
	done := make(chan struct{})
	var got []runlog.Line
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- runlog.ReadFrom(ctx, pages, runlog.Options{Follow: true, Tail: 1, Done: done}, func(l runlog.Line) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, l)
			return nil
		})
	}()
	time.Sleep(200 * time.Millisecond)
	tenantChunk(t, conn.JS, "a", "r-1", 3, bus.LogStdout, 0, time.Now(), "late\nlast")
	time.Sleep(300 * time.Millisecond)
	close(done)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// The tail's last line, what came after, then each stream's trailing
	// partial line (attempt 1's stderr, never ended).
	if n := len(got); n != 4 || got[0].Text != "line 518" || got[1].Text != "late" || got[2].Text != "eee" || got[3].Text != "last" || !got[3].Partial {
		t.Fatalf("follow: %+v", got)
	}
}

func tailOf(ls []runlog.Line) []runlog.Line { return ls[max(len(ls)-3, 0):] }

// TestPageSourceRefusal: a read the service refuses is the reader's error.
func TestPageSourceRefusal(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	servePages(t, conn)
	err := runlog.ReadFrom(context.Background(), runlog.PageSource(conn.NC, "a", schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r.1"}), runlog.Options{}, func(runlog.Line) error { return nil })
	if r, ok := err.(*schemas.Refusal); !ok || r.Code != schemas.CodeInvalidRunID || r.Field != "run_id" {
		t.Fatalf("err = %v, want invalid_run_id naming run_id", err)
	}
}
