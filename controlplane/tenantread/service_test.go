package tenantread_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/tenantread"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// serve starts the service over a provisioned bus until t ends.
func serve(t *testing.T, tenants []string) *bus.Conn {
	t.Helper()
	conn := testenv.ProvisionedBus(t, "cp")
	kv, err := conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop, err := tenantread.New(conn, kv, tenants, zap.NewNop()).Serve(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); cancel(); wg.Wait() })
	return conn
}

// ask sends req on tenant's op in enc and decodes the reply into R.
func ask[R any](t *testing.T, nc *nats.Conn, tenant, op string, enc codec.Encoding, req any) schemas.Reply[R] {
	t.Helper()
	b, err := codec.Encode(enc, req)
	if err != nil {
		t.Fatal(err)
	}
	subj := bus.TenantSubject(tenant, op)
	resp, err := nc.RequestMsg(&nats.Msg{Subject: subj, Data: b, Header: nats.Header{codec.ContentTypeHeader: []string{enc.ContentType()}}}, 20*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subj, err)
	}
	var rep schemas.Reply[R]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &rep); err != nil {
		t.Fatalf("%s: reply %q: %v", subj, resp.Data, err)
	}
	return rep
}

func putRun(t *testing.T, conn *bus.Conn, r schemas.Run) {
	t.Helper()
	kv, err := conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(r)
	if _, err := kv.Put(context.Background(), r.ID, b); err != nil {
		t.Fatal(err)
	}
}

func refusedNotFound(t *testing.T, what string, r *schemas.Refusal) {
	t.Helper()
	if r == nil || r.Code != schemas.CodeRunNotFound || r.Field != "run_id" {
		t.Fatalf("%s: refusal %+v, want run_not_found naming run_id", what, r)
	}
}

// TestGetAndListConfined: a tenant gets and lists its own Runs only; a Run
// of another tenant is refused exactly as a missing one.
func TestGetAndListConfined(t *testing.T) {
	conn := serve(t, nil)
	now := time.Now().UTC()
	putRun(t, conn, schemas.Run{ID: "r-a1", Tenant: "a", Phase: schemas.PhaseRunning, CreatedAt: now.Add(-time.Minute),
		Outbox: []schemas.RunEvent{{RunID: "r-a1", Seq: 1}}})
	putRun(t, conn, schemas.Run{ID: "r-a2", Tenant: "a", Phase: schemas.PhaseSucceeded, CreatedAt: now})
	putRun(t, conn, schemas.Run{ID: "r-b1", Tenant: "b", Phase: schemas.PhaseRunning, CreatedAt: now})
	putRun(t, conn, schemas.Run{ID: "r-d1", Phase: schemas.PhaseRunning, CreatedAt: now}) // stored before tenants

	for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		rep := ask[schemas.Run](t, conn.NC, "a", bus.TenantRunsGet, enc, schemas.RunsGetRequest{RunID: "r-a1"})
		if rep.OK == nil || rep.OK.ID != "r-a1" || rep.OK.Outbox != nil {
			t.Fatalf("get r-a1 as a (%v): %+v", enc, rep)
		}
	}
	foreign := ask[schemas.Run](t, conn.NC, "a", bus.TenantRunsGet, codec.JSON, schemas.RunsGetRequest{RunID: "r-b1"})
	refusedNotFound(t, "a gets b's run", foreign.Refusal)
	for _, kind := range []string{schemas.ReadEvents, schemas.ReadLogs} {
		rd := ask[schemas.ReadPage](t, conn.NC, "a", bus.TenantRunsRead, codec.JSON, schemas.RunsReadRequest{Kind: kind, RunID: "r-b1", Max: 1})
		refusedNotFound(t, "a reads b's run's "+kind, rd.Refusal)
	}
	missing := ask[schemas.Run](t, conn.NC, "a", bus.TenantRunsGet, codec.JSON, schemas.RunsGetRequest{RunID: "r-zz"})
	refusedNotFound(t, "a gets a missing run", missing.Refusal)
	if d := ask[schemas.Run](t, conn.NC, schemas.DefaultTenant, bus.TenantRunsGet, codec.JSON, schemas.RunsGetRequest{RunID: "r-d1"}); d.OK == nil {
		t.Fatalf("a Run stored without a tenant is the default tenant's: %+v", d.Refusal)
	}

	list := ask[schemas.RunsList](t, conn.NC, "a", bus.TenantRunsList, codec.JSON, schemas.RunsListRequest{})
	if list.OK == nil || len(list.OK.Runs) != 2 || list.OK.Runs[0].ID != "r-a2" || list.OK.Runs[1].ID != "r-a1" || list.OK.LeftOff != 0 {
		t.Fatalf("list as a: %+v", list)
	}
	list = ask[schemas.RunsList](t, conn.NC, "a", bus.TenantRunsList, codec.JSON, schemas.RunsListRequest{Limit: 1})
	if list.OK == nil || len(list.OK.Runs) != 1 || list.OK.LeftOff != 1 {
		t.Fatalf("list as a, limit 1: %+v", list)
	}
	list = ask[schemas.RunsList](t, conn.NC, "a", bus.TenantRunsList, codec.JSON, schemas.RunsListRequest{Phase: schemas.PhaseRunning})
	if list.OK == nil || len(list.OK.Runs) != 1 || list.OK.Runs[0].ID != "r-a1" {
		t.Fatalf("list as a, running: %+v", list)
	}
	if list := ask[schemas.RunsList](t, conn.NC, "c", bus.TenantRunsList, codec.JSON, schemas.RunsListRequest{}); list.OK == nil || len(list.OK.Runs) != 0 {
		t.Fatalf("list as c: %+v", list)
	}
}

// TestTenantOfSubject: the subject's tenant must be a tenant name, and one
// the control plane configured when it names its tenants.
func TestTenantOfSubject(t *testing.T) {
	conn := serve(t, []string{"a", schemas.DefaultTenant})
	if rep := ask[schemas.Run](t, conn.NC, "A_B", bus.TenantRunsGet, codec.JSON, schemas.RunsGetRequest{RunID: "r-1"}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeInvalidTenant {
		t.Fatalf("bad tenant: %+v", rep)
	}
	if rep := ask[schemas.RunsList](t, conn.NC, "zz", bus.TenantRunsList, codec.JSON, schemas.RunsListRequest{}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeTenantUnknown {
		t.Fatalf("unknown tenant: %+v", rep)
	}
	if rep := ask[schemas.ReadPage](t, conn.NC, "a", bus.TenantRunsRead, codec.JSON, map[string]any{"kind": "logs", "run_id": "r-1", "tenant": "b"}); rep.Refusal == nil || rep.Refusal.Code != schemas.CodeUnknownField {
		t.Fatalf("a body naming a tenant: %+v", rep)
	}
}

func publishChunk(t *testing.T, conn *bus.Conn, subject, text string) uint64 {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(text)
	m.Header.Set(bus.HeaderLogStream, bus.LogStdout)
	ack, err := conn.JS.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestReadPages: runs.read pages through the tenant's own subject only,
// bounded by max, answers the last sequence alone with max 0, long-polls
// with wait_ms, and leaves no consumer behind.
func TestReadPages(t *testing.T) {
	conn := serve(t, nil)
	for i := range 5 {
		publishChunk(t, conn, bus.RunLogsSubject("a", "r-1"), "a"+strconv.Itoa(i))
		publishChunk(t, conn, bus.RunLogsSubject("b", "r-1"), "b"+strconv.Itoa(i)) // the same Run id in another tenant
	}
	publishChunk(t, conn, bus.SessionLogsSubject("a", "s1"), "session")

	read := func(req schemas.RunsReadRequest) schemas.ReadPage {
		t.Helper()
		rep := ask[schemas.ReadPage](t, conn.NC, "a", bus.TenantRunsRead, codec.MsgPack, req)
		if rep.OK == nil {
			t.Fatalf("read %+v: %+v", req, rep.Refusal)
		}
		return *rep.OK
	}
	var texts []string
	var last uint64
	for start := uint64(0); ; {
		p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-1", StartSeq: start, Max: 2})
		if len(p.Messages) > 2 {
			t.Fatalf("page of %d messages, max 2", len(p.Messages))
		}
		last = p.LastSeq
		if len(p.Messages) == 0 {
			break
		}
		for _, m := range p.Messages {
			texts = append(texts, string(m.Data))
			if len(m.Headers[bus.HeaderLogStream]) != 1 || m.Headers[bus.HeaderLogStream][0] != bus.LogStdout {
				t.Fatalf("headers lost: %+v", m.Headers)
			}
		}
		start = p.Messages[len(p.Messages)-1].Seq + 1
	}
	if got := texts; len(got) != 5 || got[0] != "a0" || got[4] != "a4" {
		t.Fatalf("a's r-1 read %q, want a0..a4 and nothing of b's", got)
	}
	if p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-1"}); p.LastSeq != last || len(p.Messages) != 0 || p.LastTime == nil {
		t.Fatalf("max 0: %+v, want only the last sequence %d", p, last)
	}
	if p := read(schemas.RunsReadRequest{Kind: schemas.ReadSessionLogs, Session: "s1", Max: 10}); len(p.Messages) != 1 || string(p.Messages[0].Data) != "session" {
		t.Fatalf("session read: %+v", p)
	}
	for _, tenant := range []string{"a", "b"} {
		if _, err := conn.JS.Publish(context.Background(), bus.RunEventsSubject(tenant, "r-1"), []byte(`{"run_id":"r-1","tenant":"`+tenant+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if p := read(schemas.RunsReadRequest{Kind: schemas.ReadEvents, RunID: "r-1", Max: 10}); len(p.Messages) != 1 || !strings.Contains(string(p.Messages[0].Data), `"a"`) {
		t.Fatalf("events read: %+v", p)
	}
	if p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-none", Max: 10}); len(p.Messages) != 0 || p.LastSeq != 0 {
		t.Fatalf("a subject with nothing stored: %+v", p)
	}

	// A page holds at most MaxReadPageBytes of bodies: the rest is the
	// next page's.
	big := strings.Repeat("x", 60<<10)
	for range 10 {
		publishChunk(t, conn, bus.RunLogsSubject("a", "r-big"), big)
	}
	total := 0
	for start, pages := uint64(0), 0; ; pages++ {
		p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-big", StartSeq: start, Max: 10})
		if len(p.Messages) == 0 {
			if total != 10 || pages < 3 {
				t.Fatalf("%d chunks of 60 KiB in %d pages; want all 10 in pages of at most 256 KiB", total, pages)
			}
			break
		}
		if n := len(p.Messages); n > schemas.MaxReadPageBytes/len(big) {
			t.Fatalf("a page of %d chunks of 60 KiB, over %d bytes", n, schemas.MaxReadPageBytes)
		}
		total += len(p.Messages)
		start = p.Messages[len(p.Messages)-1].Seq + 1
	}

	// A follower's long poll: nothing past the last yet, then a chunk.
	start := time.Now()
	if p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-1", StartSeq: last + 1, Max: 10, WaitMillis: 300}); len(p.Messages) != 0 || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("long poll with nothing new: %+v after %s", p, time.Since(start))
	}
	late := time.AfterFunc(300*time.Millisecond, func() {
		if _, err := conn.JS.Publish(context.Background(), bus.RunLogsSubject("a", "r-1"), []byte("late")); err != nil {
			t.Error(err)
		}
	})
	defer late.Stop()
	p := read(schemas.RunsReadRequest{Kind: schemas.ReadLogs, RunID: "r-1", StartSeq: last + 1, Max: 10, WaitMillis: 5000})
	if len(p.Messages) != 1 || string(p.Messages[0].Data) != "late" || p.LastSeq != p.Messages[0].Seq {
		t.Fatalf("long poll: %+v", p)
	}

	// Every page's consumer is gone.
	st, err := conn.JS.Stream(context.Background(), bus.StreamLogs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on %s", info.State.Consumers, bus.StreamLogs)
	}
}
