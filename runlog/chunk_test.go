package runlog

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// Seed corpora live in testdata/fuzz/FuzzParseChunk. Run the target with
//
//	go test -run='^$' -fuzz='^FuzzParseChunk$' -fuzztime=20s ./runlog/

const (
	runSubject = "wf.logs.default.run.r-1"
	t0         = "2026-12-02T19:05:04.810224162Z"
)

func header(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func dataHeader(attempt, stream string, off int64) nats.Header {
	return header(bus.HeaderLogAttempt, attempt, bus.HeaderLogStream, stream, bus.HeaderLogOffset, strconv.FormatInt(off, 10),
		bus.HeaderLogTime, t0, bus.HeaderLogNode, "n1")
}

// TestSubjectRun: a Run's and a session's output subjects, as bus names
// them, are the only ones a chunk may come on.
func TestSubjectRun(t *testing.T) {
	if id, err := subjectRun(bus.RunLogsSubject("acme", "r-1")); err != nil || id != "r-1" {
		t.Fatalf("run subject: %q, %v", id, err)
	}
	if id, err := subjectRun(bus.SessionLogsSubject("acme", "s1")); err != nil || id != "" {
		t.Fatalf("session subject: %q, %v", id, err)
	}
	for _, bad := range []string{"wf.logs.run.r-1", "wf.logs.acme.job.r-1", "wf.events.acme.run.r-1", "wf.logs.acme.run.r-1.x"} {
		if _, err := subjectRun(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseChunk(t *testing.T) {
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 42}, Timestamp: time.Unix(5, 0)}
	c, err := ParseChunk(runSubject, dataHeader("r-1-a2", bus.LogStderr, 128), []byte("x\n"), meta)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := time.Parse(time.RFC3339Nano, t0)
	if c.Attempt != "r-1-a2" || c.Stream != bus.LogStderr || c.Offset != 128 || !c.Time.Equal(want) || c.Node != "n1" ||
		string(c.Data) != "x\n" || c.End || c.Seq != 42 || !c.Stored.Equal(time.Unix(5, 0)) {
		t.Fatalf("chunk %+v", c)
	}

	end, err := ParseChunk(runSubject, header(bus.HeaderLogAttempt, "r-1-a1", bus.HeaderLogStream, bus.LogStdout, bus.HeaderLogEnd, "130"), nil, nil)
	if err != nil || !end.End || end.Length != 130 || end.Offset != 130 || !end.Time.IsZero() {
		t.Fatalf("end mark: %+v %v", end, err)
	}
	if c, err := ParseChunk(bus.SessionLogsSubject("acme", "s1"), dataHeader("acme.s1:w-7", bus.LogStdout, 0), []byte("hi\n"), nil); err != nil || c.Attempt != "acme.s1:w-7" {
		t.Fatalf("session chunk: %+v %v", c, err)
	}
}

func TestParseChunkRefusals(t *testing.T) {
	ok := func() nats.Header { return dataHeader("r-1-a1", bus.LogStdout, 0) }
	with := func(k, v string) nats.Header {
		h := ok()
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
		return h
	}
	twice := ok()
	twice.Add(bus.HeaderLogOffset, "7")
	for _, tc := range []struct {
		name    string
		subject string
		h       nats.Header
		data    string
		code    Code
		field   string
	}{
		{"events subject", "wf.events.default.run.r-1", ok(), "x\n", CodeWrongSubject, "subject"},
		{"run subject with two tokens", "wf.logs.default.run.r-1.x", ok(), "x\n", CodeWrongSubject, "subject"},
		{"session subject with one token", "wf.logs.acme.session", ok(), "x\n", CodeWrongSubject, "subject"},
		{"no attempt", runSubject, with(bus.HeaderLogAttempt, ""), "x\n", CodeMissingHeader, bus.HeaderLogAttempt},
		{"another run's attempt", runSubject, with(bus.HeaderLogAttempt, "r-2-a1"), "x\n", CodeInvalidHeader, bus.HeaderLogAttempt},
		{"attempt 0", runSubject, with(bus.HeaderLogAttempt, "r-1-a0"), "x\n", CodeInvalidHeader, bus.HeaderLogAttempt},
		{"attempt 01", runSubject, with(bus.HeaderLogAttempt, "r-1-a01"), "x\n", CodeInvalidHeader, bus.HeaderLogAttempt},
		{"no stream", runSubject, with(bus.HeaderLogStream, ""), "x\n", CodeMissingHeader, bus.HeaderLogStream},
		{"stream stdin", runSubject, with(bus.HeaderLogStream, "stdin"), "x\n", CodeInvalidHeader, bus.HeaderLogStream},
		{"no offset", runSubject, with(bus.HeaderLogOffset, ""), "x\n", CodeMissingHeader, bus.HeaderLogOffset},
		{"negative offset", runSubject, with(bus.HeaderLogOffset, "-1"), "x\n", CodeInvalidHeader, bus.HeaderLogOffset},
		{"signed offset", runSubject, with(bus.HeaderLogOffset, "+1"), "x\n", CodeInvalidHeader, bus.HeaderLogOffset},
		{"huge offset", runSubject, with(bus.HeaderLogOffset, "99999999999999999999"), "x\n", CodeInvalidHeader, bus.HeaderLogOffset},
		{"offset overflows", runSubject, with(bus.HeaderLogOffset, strconv.FormatInt(math.MaxInt64-1, 10)), "x\n", CodeInvalidHeader, bus.HeaderLogOffset},
		{"offset twice", runSubject, twice, "x\n", CodeInvalidHeader, bus.HeaderLogOffset},
		{"no time", runSubject, with(bus.HeaderLogTime, ""), "x\n", CodeMissingHeader, bus.HeaderLogTime},
		{"bad time", runSubject, with(bus.HeaderLogTime, "yesterday"), "x\n", CodeInvalidHeader, bus.HeaderLogTime},
		{"end with body", runSubject, with(bus.HeaderLogEnd, "2"), "x\n", CodeEndWithData, "body"},
		{"bad end", runSubject, header(bus.HeaderLogAttempt, "r-1-a1", bus.HeaderLogStream, bus.LogStdout, bus.HeaderLogEnd, "ten"), "", CodeInvalidHeader, bus.HeaderLogEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseChunk(tc.subject, tc.h, []byte(tc.data), nil)
			if !errors.Is(err, &ChunkError{Code: tc.code, Field: tc.field}) {
				t.Fatalf("got %v, want %s on %s", err, tc.code, tc.field)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%q does not name %s", err, tc.field)
			}
		})
	}
}

// FuzzParseChunk: ParseChunk never panics, refuses with a coded
// *ChunkError, and what it accepts keeps the contract: a known stream, an
// attempt, an end mark without bytes, offsets that do not overflow, and
// the same chunk when its headers are written back.
func FuzzParseChunk(f *testing.F) {
	f.Add(runSubject, "r-1-a1", "stdout", "0", t0, "n1", "", []byte("hello\nworld\n"))
	f.Add(runSubject, "r-1-a2", "stderr", "65536", "2026-12-02T19:05:04Z", "", "", []byte("split"))
	f.Add(runSubject, "r-1-a1", "stdout", "", "", "", "12", []byte(nil))
	f.Add("wf.logs.acme.session.s1", "w-1", "stdout", "3", t0, "n2", "", []byte("x"))
	f.Add(runSubject, "r-1-a1", "stdout", "9223372036854775807", t0, "n1", "", []byte("x"))
	f.Fuzz(func(t *testing.T, subject, attempt, stream, offset, ts, node, end string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{bus.HeaderLogAttempt: attempt, bus.HeaderLogStream: stream, bus.HeaderLogOffset: offset,
			bus.HeaderLogTime: ts, bus.HeaderLogNode: node, bus.HeaderLogEnd: end} {
			if v != "" {
				h.Set(k, v)
			}
		}
		c, err := ParseChunk(subject, h, data, nil)
		if err != nil {
			var ce *ChunkError
			if !errors.As(err, &ce) || ce.Code == "" || ce.Field == "" || ce.Reason == "" {
				t.Fatalf("refusal %v is not a coded ChunkError", err)
			}
			return
		}
		if c.Attempt == "" || (c.Stream != bus.LogStdout && c.Stream != bus.LogStderr) || c.Offset < 0 ||
			c.Offset > math.MaxInt64-int64(len(c.Data)) || (c.End && (len(c.Data) > 0 || c.Length < 0)) || (!c.End && c.Time.IsZero()) {
			t.Fatalf("accepted %+v", c)
		}
		back := header(bus.HeaderLogAttempt, c.Attempt, bus.HeaderLogStream, c.Stream, bus.HeaderLogOffset, strconv.FormatInt(c.Offset, 10))
		if !c.Time.IsZero() {
			back.Set(bus.HeaderLogTime, c.Time.Format(time.RFC3339Nano))
		}
		if c.Node != "" {
			back.Set(bus.HeaderLogNode, c.Node)
		}
		if c.End {
			back.Set(bus.HeaderLogEnd, strconv.FormatInt(c.Length, 10))
		}
		again, err := ParseChunk(subject, back, data, nil)
		if err != nil || again.Attempt != c.Attempt || again.Stream != c.Stream || again.Offset != c.Offset || !again.Time.Equal(c.Time) ||
			again.Node != c.Node || again.End != c.End || again.Length != c.Length {
			t.Fatalf("written back: %+v %v, want %+v", again, err, c)
		}
	})
}
