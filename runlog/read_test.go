package runlog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/runlog"
)

// pub stores one chunk of runID's output as a node would.
type pub struct {
	t     *testing.T
	js    jetstream.JetStream
	runID string
}

func (p pub) chunk(attempt int, stream string, off int64, at time.Time, data string) {
	p.t.Helper()
	id := runlogAttempt(p.runID, attempt)
	p.msg(bus.LogMsgID(id, stream, off), nats.Header{bus.HeaderLogAttempt: {id}, bus.HeaderLogStream: {stream},
		bus.HeaderLogOffset: {strconv.FormatInt(off, 10)}, bus.HeaderLogTime: {at.Format(time.RFC3339Nano)}, bus.HeaderLogNode: {"n1"}}, data)
}

func (p pub) end(attempt int, stream string, length int64) {
	p.t.Helper()
	id := runlogAttempt(p.runID, attempt)
	p.msg(bus.LogEndMsgID(id, stream), nats.Header{bus.HeaderLogAttempt: {id}, bus.HeaderLogStream: {stream},
		bus.HeaderLogEnd: {strconv.FormatInt(length, 10)}, bus.HeaderLogNode: {"n1"}}, "")
}

// msg publishes with msgID as Nats-Msg-Id ("" for none: a resend after
// the dedupe window).
func (p pub) msg(msgID string, h nats.Header, data string) {
	p.t.Helper()
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := p.js.PublishMsg(context.Background(), &nats.Msg{Subject: bus.RunLogsSubject("default", p.runID), Header: h, Data: []byte(data)}, opts...); err != nil {
		p.t.Fatal(err)
	}
}

func runlogAttempt(runID string, n int) string { return runID + "-a" + strconv.Itoa(n) }

var t1 = time.Date(2026, 12, 2, 19, 5, 4, 810224162, time.UTC)

func read(t *testing.T, js jetstream.JetStream, runID string, o runlog.Options) ([]string, []error) {
	t.Helper()
	var out []string
	var bad []error
	o.Invalid = func(seq uint64, err error) { bad = append(bad, err) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := runlog.Read(ctx, js, bus.RunLogsSubject("default", runID), o, func(l runlog.Line) error {
		out = append(out, l.Attempt[len(runID)+1:]+" "+l.Stream+" "+l.Text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out, bad
}

// storedRun publishes two attempts' output: duplicates, an overlap, a line
// split across chunks, an end mark after a partial line, both streams, and
// one message that is not a chunk.
func storedRun(t *testing.T, js jetstream.JetStream, runID string) {
	p := pub{t, js, runID}
	p.chunk(1, bus.LogStdout, 0, t1, "hello\nwor")
	p.chunk(1, bus.LogStdout, 0, t1, "hello\nwor") // same Msg-Id: the stream drops it
	p.chunk(1, bus.LogStderr, 0, t1.Add(time.Second), "warning: x\n")
	p.chunk(1, bus.LogStdout, 9, t1.Add(2*time.Second), "ld\n")
	p.msg("", nats.Header{bus.HeaderLogAttempt: {runlogAttempt(runID, 1)}, bus.HeaderLogStream: {bus.LogStdout},
		bus.HeaderLogOffset: {"0"}, bus.HeaderLogTime: {t1.Format(time.RFC3339Nano)}}, "hello\nworld\n") // resent after the window
	p.chunk(1, bus.LogStdout, 6, t1.Add(3*time.Second), "world\nbye") // overlaps
	p.msg("bad", nats.Header{bus.HeaderLogStream: {bus.LogStdout}}, "no attempt\n")
	p.end(1, bus.LogStdout, 15)
	p.end(1, bus.LogStderr, 11)
	p.chunk(2, bus.LogStderr, 0, t1.Add(time.Minute), "retrying\n")
	p.chunk(2, bus.LogStdout, 0, t1.Add(time.Minute), "hello again\n[warmfleet: dropped 4096 bytes of stdout]\ndone\n")
}

func TestReadStored(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	storedRun(t, conn.JS, "r-1")
	pub{t, conn.JS, "r-2"}.chunk(1, bus.LogStdout, 0, t1, "another run\n")

	got, bad := read(t, conn.JS, "r-1", runlog.Options{})
	want := []string{
		"a1 stdout hello",
		"a1 stderr warning: x",
		"a1 stdout world",
		"a1 stdout bye",
		"a2 stderr retrying",
		"a2 stdout hello again",
		"a2 stdout [warmfleet: dropped 4096 bytes of stdout]",
		"a2 stdout done",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	if len(bad) != 1 || !errors.Is(bad[0], &runlog.ChunkError{Code: runlog.CodeMissingHeader, Field: bus.HeaderLogAttempt}) {
		t.Fatalf("invalid messages: %v", bad)
	}

	got, _ = read(t, conn.JS, "r-1", runlog.Options{Attempt: "r-1-a1", Stream: bus.LogStdout})
	if want := []string{"a1 stdout hello", "a1 stdout world", "a1 stdout bye"}; !slices.Equal(got, want) {
		t.Fatalf("attempt 1's stdout: %q", got)
	}
	got, _ = read(t, conn.JS, "r-1", runlog.Options{Tail: 3})
	if !slices.Equal(got, want[5:]) {
		t.Fatalf("tail 3: %q", got)
	}
	got, _ = read(t, conn.JS, "r-1", runlog.Options{Tail: 2, Attempt: "r-1-a1"})
	if want := []string{"a1 stdout world", "a1 stdout bye"}; !slices.Equal(got, want) {
		t.Fatalf("tail 2 of attempt 1: %q", got)
	}
	got, _ = read(t, conn.JS, "r-1", runlog.Options{Tail: 100})
	if !slices.Equal(got, want) {
		t.Fatalf("tail 100: %q", got)
	}
	if got, _ := read(t, conn.JS, "r-none", runlog.Options{}); len(got) != 0 {
		t.Fatalf("a Run without output: %q", got)
	}
	err := runlog.Read(context.Background(), conn.JS, bus.RunLogsSubject("default", "r-1"), runlog.Options{Stream: "stdin"}, nil)
	if err == nil {
		t.Fatal("stream stdin accepted")
	}
}

// A tail reads back in growing windows: here the Run's lines are far
// apart among other Runs' messages.
func TestReadTailAmongOthers(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	p, other := pub{t, conn.JS, "r-1"}, pub{t, conn.JS, "r-other"}
	off := int64(0)
	for i := range 5 {
		line := fmt.Sprintf("line %d\n", i)
		p.chunk(1, bus.LogStdout, off, t1, line)
		off += int64(len(line))
		for j := range 300 {
			other.chunk(1, bus.LogStdout, int64(i*300+j), t1, "x\n")
		}
	}
	got, _ := read(t, conn.JS, "r-1", runlog.Options{Tail: 2})
	if want := []string{"a1 stdout line 3", "a1 stdout line 4"}; !slices.Equal(got, want) {
		t.Fatalf("tail 2: %q", got)
	}
}

func TestReadSince(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	p := pub{t, conn.JS, "r-1"}
	p.chunk(1, bus.LogStdout, 0, time.Now(), "old\n")
	time.Sleep(20 * time.Millisecond)
	since := time.Now()
	time.Sleep(20 * time.Millisecond)
	p.chunk(1, bus.LogStdout, 4, time.Now(), "new\n")
	got, _ := read(t, conn.JS, "r-1", runlog.Options{Since: since})
	if want := []string{"a1 stdout new"}; !slices.Equal(got, want) {
		t.Fatalf("since: %q", got)
	}
	if got, _ := read(t, conn.JS, "r-1", runlog.Options{Since: time.Now()}); len(got) != 0 {
		t.Fatalf("since now: %q", got)
	}
}

// A follower prints what comes as it comes and returns once Done is
// closed and it has read what was stored by then.
func TestReadFollow(t *testing.T) {
	conn := testenv.ProvisionedBus(t, "reader")
	p := pub{t, conn.JS, "r-1"}
	p.chunk(1, bus.LogStdout, 0, t1, "one\ntwo\nthree\n")

	for _, tail := range []int{0, 1} {
		t.Run(fmt.Sprintf("tail %d", tail), func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			lines := make(chan string, 16)
			done := make(chan struct{})
			res := make(chan error, 1)
			go func() {
				res <- runlog.Read(context.Background(), conn.JS, bus.RunLogsSubject("default", "r-1"), runlog.Options{Follow: true, Done: done, Tail: tail},
					func(l runlog.Line) error {
						mu.Lock()
						got = append(got, l.Text)
						mu.Unlock()
						lines <- l.Text
						return nil
					})
			}()
			wait := func(want string) {
				t.Helper()
				for {
					select {
					case l := <-lines:
						if l == want {
							return
						}
					case err := <-res:
						t.Fatalf("Read returned early: %v", err)
					case <-time.After(10 * time.Second):
						t.Fatalf("no line %q", want)
					}
				}
			}
			if tail == 1 { // the first subtest stored the rest
				wait("five")
			} else {
				wait("three")
				p.chunk(1, bus.LogStdout, 14, t1, "four\nfi")
				wait("four")
			}
			select {
			case err := <-res:
				t.Fatalf("Read returned before Done: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			if tail == 0 {
				p.chunk(1, bus.LogStdout, 21, t1, "ve\n")
				p.end(1, bus.LogStdout, 24)
			}
			close(done)
			select {
			case err := <-res:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Read did not return after Done")
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{"one", "two", "three", "four", "five"}
			if tail == 1 {
				want = want[4:]
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got %q, want %q", got, want)
			}
		})
	}
}

// The per-Run cap: a WF_LOGS made before the cap existed gets it when
// provisioned again; a Run writing past it loses only its own oldest
// chunks, and Read tells the missing bytes as a Gap.
func TestReadPerRunCap(t *testing.T) {
	n := testenv.StartNATS(t)
	conn := testenv.Dial(t, n.URL(), "cap")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The stream as it was defined before the cap.
	if _, err := conn.JS.CreateStream(ctx, jetstream.StreamConfig{Name: bus.StreamLogs, Subjects: []string{bus.SubjectLogsAll},
		Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		t.Fatal(err)
	}
	const capChunks = 4
	if err := bus.Provision(ctx, conn.JS, bus.Topology{LogsMaxChunksPerRun: capChunks}); err != nil {
		t.Fatal(err)
	}
	s, err := conn.JS.Stream(ctx, bus.StreamLogs)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxMsgsPerSubject; got != capChunks {
		t.Fatalf("WF_LOGS's per-subject cap after provisioning an old stream is %d, want %d", got, capChunks)
	}
	small := pub{t, conn.JS, "r-small"}
	small.chunk(1, bus.LogStdout, 0, t1, "small 1\n")
	small.chunk(1, bus.LogStdout, 8, t1, "small 2\n")
	big := pub{t, conn.JS, "r-big"}
	for i := range 10 {
		big.chunk(1, bus.LogStdout, int64(i*6), t1, fmt.Sprintf("big %d\n", i))
	}
	small.chunk(1, bus.LogStdout, 16, t1, "small 3\n")

	if got, _ := read(t, conn.JS, "r-small", runlog.Options{}); !slices.Equal(got, []string{"a1 stdout small 1", "a1 stdout small 2", "a1 stdout small 3"}) {
		t.Fatalf("another Run's output after one went past the cap: %q", got)
	}
	var gaps []runlog.Gap
	got, _ := read(t, conn.JS, "r-big", runlog.Options{Gaps: func(g runlog.Gap) { gaps = append(gaps, g) }})
	if !slices.Equal(got, []string{"a1 stdout big 6", "a1 stdout big 7", "a1 stdout big 8", "a1 stdout big 9"}) {
		t.Fatalf("the Run past the cap keeps %q, want its last %d chunks", got, capChunks)
	}
	if want := []runlog.Gap{{Attempt: "r-big-a1", Stream: bus.LogStdout, From: 0, To: 36}}; !slices.Equal(gaps, want) {
		t.Fatalf("gaps %v, want %v", gaps, want)
	}
}
