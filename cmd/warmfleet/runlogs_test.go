package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

// syncBuffer is a buffer a test can read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cliOut runs one warmfleet command line against url, its stdout and
// stderr kept apart.
func cliOut(url string, stdout, stderr *syncBuffer, args ...string) error {
	root := newRoot()
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(append([]string{"--nats-url", url}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return root.ExecuteContext(ctx)
}

func logs(t *testing.T, url string, args ...string) (string, string, error) {
	t.Helper()
	var out, errs syncBuffer
	err := cliOut(url, &out, &errs, append([]string{"run", "logs"}, args...)...)
	return out.String(), errs.String(), err
}

// logBus is an embedded NATS with warmfleet's streams and buckets.
type logBus struct {
	t   *testing.T
	url string
	js  jetstream.JetStream
	kv  jetstream.KeyValue
}

func newLogBus(t *testing.T) logBus {
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "test")
	ctx := context.Background()
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	serveReads(t, conn)
	return logBus{t, n.URL(), conn.JS, kv}
}

func (b logBus) putRun(id string, phase schemas.Phase, attempts int) {
	b.t.Helper()
	r := schemas.Run{ID: id, Phase: phase, Attempt: attempts, AttemptID: schemas.WorkloadID(id, attempts), NodeID: "n1", CreatedAt: time.Now()}
	v, _ := json.Marshal(r)
	if _, err := b.kv.Put(context.Background(), id, v); err != nil {
		b.t.Fatal(err)
	}
}

// event stores one of a default-tenant Run's events as the control plane does.
func (b logBus) event(ev schemas.RunEvent) {
	b.t.Helper()
	v, _ := json.Marshal(ev)
	if _, err := b.js.Publish(context.Background(), bus.RunEventsSubject(schemas.DefaultTenant, ev.RunID), v); err != nil {
		b.t.Fatal(err)
	}
}

// chunk stores bytes of one attempt's stream as a node does.
func (b logBus) chunk(runID string, attempt int, stream string, off int64, at time.Time, data string) {
	b.t.Helper()
	id := schemas.WorkloadID(runID, attempt)
	m := &nats.Msg{Subject: bus.RunLogsSubject(schemas.DefaultTenant, runID), Data: []byte(data), Header: nats.Header{bus.HeaderLogAttempt: {id}, bus.HeaderLogStream: {stream},
		bus.HeaderLogOffset: {strconv.FormatInt(off, 10)}, bus.HeaderLogTime: {at.Format(time.RFC3339Nano)}, bus.HeaderLogNode: {"n1"}}}
	if _, err := b.js.PublishMsg(context.Background(), m, jetstream.WithMsgID(bus.LogMsgID(id, stream, off))); err != nil {
		b.t.Fatal(err)
	}
}

func TestRunLogs(t *testing.T) { asEachReader(t, testRunLogs) }

func testRunLogs(t *testing.T) {
	b := newLogBus(t)
	b.putRun("r-1", schemas.PhaseFailed, 2)
	b.putRun("r-ok", schemas.PhaseSucceeded, 1)
	t0 := time.Now().Add(-time.Minute).UTC()
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	b.chunk("r-1", 1, bus.LogStdout, 0, sec(0), "first try\n")
	b.chunk("r-1", 1, bus.LogStderr, 0, sec(1), "lost the node\n")
	b.chunk("r-1", 2, bus.LogStdout, 0, sec(10), "hello\nwor")
	b.chunk("r-1", 2, bus.LogStdout, 0, sec(10), "hello\nwor") // stored once
	b.chunk("r-1", 2, bus.LogStderr, 0, sec(11), "warning\n")
	b.chunk("r-1", 2, bus.LogStdout, 9, sec(12), "ld\n")
	b.chunk("r-1", 2, bus.LogStdout, 6, sec(13), "world\nbye\tnow\n") // overlaps
	b.chunk("r-1", 2, bus.LogStderr, 8, sec(14), "boom\n")
	b.chunk("r-ok", 1, bus.LogStdout, 0, sec(0), "fine\n")

	for _, tc := range []struct {
		args           []string
		stdout, stderr string
	}{
		{[]string{"r-1"},
			"==> attempt 1 on n1 <==\nfirst try\n==> attempt 2 on n1 <==\nhello\nworld\nbye\tnow\n", "lost the node\nwarning\nboom\n"},
		{[]string{"r-1", "--attempt", "2", "--stream", "stderr"}, "", "warning\nboom\n"},
		{[]string{"r-1", "--stream", "stderr"}, "", "==> attempt 1 on n1 <==\nlost the node\n==> attempt 2 on n1 <==\nwarning\nboom\n"},
		{[]string{"r-1", "--tail", "2"}, "==> attempt 2 on n1 <==\nbye\tnow\n", "boom\n"},
		{[]string{"r-1", "--attempt", "1", "--timestamps"}, sec(0).Format(time.RFC3339Nano) + " first try\n", sec(1).Format(time.RFC3339Nano) + " lost the node\n"},
		{[]string{"r-1", "--since", "1h", "--attempt", "1"}, "first try\n", "lost the node\n"},
		{[]string{"r-1", "--since", "1s"}, "", ""},
		{[]string{"r-ok"}, "fine\n", ""},
		{[]string{"r-1", "-f", "--tail", "1"}, "==> attempt 2 on n1 <==\n", "boom\n"},
	} {
		stdout, stderr, err := logs(t, b.url, tc.args...)
		if err != nil || stdout != tc.stdout || stderr != tc.stderr {
			t.Errorf("run logs %s: %v\nstdout %q\nwant   %q\nstderr %q\nwant   %q", strings.Join(tc.args, " "), err, stdout, tc.stdout, stderr, tc.stderr)
		}
	}

	stdout, _, err := logs(t, b.url, "-o", "json", "r-1", "--attempt", "1")
	var l runlog.Line
	if err != nil || json.Unmarshal([]byte(strings.Split(stdout, "\n")[0]), &l) != nil || l.Text != "first try" || l.Attempt != "r-1-a1" || l.Stream != bus.LogStdout {
		t.Errorf("-o json: %v %q", err, stdout)
	}

	// The bytes as written: binary, a line across chunks, no final newline;
	// -o json marks the unended line and carries bytes JSON text cannot.
	b.putRun("r-raw", schemas.PhaseSucceeded, 1)
	b.chunk("r-raw", 1, bus.LogStdout, 0, sec(0), "a\x00\xff")
	b.chunk("r-raw", 1, bus.LogStdout, 3, sec(1), "b\nend")
	if stdout, stderr, err := logs(t, b.url, "r-raw"); err != nil || stdout != "a\x00\xffb\nend" || stderr != "" {
		t.Errorf("run logs r-raw: %v, stdout %q, stderr %q", err, stdout, stderr)
	}
	stdout, _, err = logs(t, b.url, "-o", "json", "r-raw")
	var recs []struct {
		Text    string `json:"text"`
		Data    []byte `json:"data"`
		Partial bool   `json:"partial"`
	}
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var r struct {
			Text    string `json:"text"`
			Data    []byte `json:"data"`
			Partial bool   `json:"partial"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("-o json line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if err != nil || len(recs) != 2 || string(recs[0].Data) != "a\x00\xffb" || recs[0].Partial || recs[1].Text != "end" || recs[1].Data != nil || !recs[1].Partial {
		t.Errorf("-o json r-raw: %v %+v", err, recs)
	}

	// Output no longer stored is noted on stderr.
	b.putRun("r-gap", schemas.PhaseSucceeded, 1)
	b.chunk("r-gap", 1, bus.LogStdout, 100, sec(0), "kept\n")
	if stdout, stderr, err := logs(t, b.url, "r-gap"); err != nil || stdout != "kept\n" || !strings.Contains(stderr, "attempt 1 stdout: bytes 0 to 100 are no longer in WF_LOGS") {
		t.Errorf("run logs r-gap: %v, stdout %q, stderr %q", err, stdout, stderr)
	}

	for _, tc := range []struct{ args []string }{
		{[]string{"r-1", "--attempt", "0"}},
		{[]string{"r-1", "--attempt", "3"}},
		{[]string{"r-1", "--tail", "-1"}},
		{[]string{"r-1", "--since", "-5m"}},
		{[]string{"r-1", "--stream", "out"}},
	} {
		_, _, err := logs(t, b.url, tc.args...)
		if flag := tc.args[1]; err == nil || !strings.HasPrefix(err.Error(), flag+" ") || !strings.Contains(err.Error(), ": pass ") {
			t.Errorf("run logs %s: %v, want a refusal naming %s and what to pass", strings.Join(tc.args, " "), err, flag)
		}
	}
	if _, _, err := logs(t, b.url, "r-nope"); err == nil || (!strings.Contains(err.Error(), "no run r-nope") && !strings.Contains(err.Error(), "run_not_found")) {
		t.Errorf("unknown run: %v", err)
	}
}

func TestRunGetShowsLastLines(t *testing.T) { asEachReader(t, testRunGetShowsLastLines) }

func testRunGetShowsLastLines(t *testing.T) {
	b := newLogBus(t)
	b.putRun("r-1", schemas.PhaseFailed, 2)
	b.putRun("r-ok", schemas.PhaseSucceeded, 1)
	t0 := time.Date(2026, 12, 2, 19, 5, 4, 0, time.UTC)
	b.chunk("r-1", 1, bus.LogStdout, 0, t0, "attempt one\n")
	var out strings.Builder
	for i := range 12 {
		out.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	b.chunk("r-1", 2, bus.LogStderr, 0, t0.Add(2*time.Second), "Traceback\n")
	b.chunk("r-1", 2, bus.LogStdout, 0, t0.Add(time.Second), out.String()) // stored later, received earlier
	b.chunk("r-ok", 1, bus.LogStdout, 0, t0, "fine\n")

	var stdout, stderr syncBuffer
	if err := cliOut(b.url, &stdout, &stderr, "run", "get", "r-1"); err != nil {
		t.Fatal(err)
	}
	_, last, ok := strings.Cut(stdout.String(), "Last lines:\n")
	want := "  19:05:05.000 stdout  line 3\n"
	for i := 4; i < 12; i++ {
		want += "  19:05:05.000 stdout  line " + strconv.Itoa(i) + "\n"
	}
	want += "  19:05:06.000 stderr  Traceback\n"
	if !ok || last != want {
		t.Fatalf("run get:\n%s\nwant the last lines\n%s", stdout.String(), want)
	}

	stdout = syncBuffer{}
	if err := cliOut(b.url, &stdout, &stderr, "-o", "json", "run", "get", "r-1"); err != nil {
		t.Fatal(err)
	}
	var v struct {
		ID        string        `json:"id"`
		LastLines []runlog.Line `json:"last_lines"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &v); err != nil || v.ID != "r-1" || len(v.LastLines) != 10 || v.LastLines[9].Text != "Traceback" {
		t.Fatalf("run get -o json: %v\n%s", err, stdout.String())
	}

	stdout = syncBuffer{}
	if err := cliOut(b.url, &stdout, &stderr, "run", "get", "r-ok"); err != nil || strings.Contains(stdout.String(), "Last lines") {
		t.Fatalf("run get of a succeeded Run: %v\n%s", err, stdout.String())
	}
}

// `run logs -f` prints output as it is stored and exits once the Run has
// ended and what was stored by then is printed.
func TestRunLogsFollow(t *testing.T) { asEachReader(t, testRunLogsFollow) }

func testRunLogsFollow(t *testing.T) {
	b := newLogBus(t)
	b.putRun("r-1", schemas.PhaseRunning, 1)
	now := time.Now()
	b.chunk("r-1", 1, bus.LogStdout, 0, now, "started\n")

	var stdout, stderr syncBuffer
	res := make(chan error, 1)
	go func() { res <- cliOut(b.url, &stdout, &stderr, "run", "logs", "-f", "r-1") }()
	waitFor := func(w *syncBuffer, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(w.String(), want) {
			select {
			case err := <-res:
				t.Fatalf("run logs -f returned early: %v\n%s", err, w.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q in %q", want, w.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(&stdout, "started\n")
	b.chunk("r-1", 1, bus.LogStderr, 0, now, "step 1 of 2\n")
	waitFor(&stderr, "step 1 of 2\n")

	b.chunk("r-1", 1, bus.LogStdout, 8, now, "last words\nno newline")
	b.putRun("r-1", schemas.PhaseFailed, 1)
	b.event(schemas.RunEvent{RunID: "r-1", Seq: 2, Type: schemas.EventPhase, Phase: schemas.PhaseFailed})
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run logs -f did not end with the Run")
	}
	if got, want := stdout.String(), "started\nlast words\nno newline"; got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
	if got, want := stderr.String(), "step 1 of 2\n"; got != want {
		t.Fatalf("stderr %q, want %q", got, want)
	}
}
