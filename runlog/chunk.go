package runlog

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// Chunk is one WF_LOGS message: a piece of one attempt's stdout or stderr,
// or (End) the mark after its last byte.
type Chunk struct {
	Attempt string // the attempt (workload) id
	Node    string // the node that ran it; "" when the header is absent
	Stream  string // bus.LogStdout or bus.LogStderr
	Offset  int64  // of Data's first byte in the stream
	Time    time.Time
	Data    []byte // shares the message's bytes
	End     bool
	Length  int64 // with End: the stream's length in bytes

	// Seq and Stored are the message's stream sequence and store time,
	// from the metadata given to ParseChunk (zero without).
	Seq    uint64
	Stored time.Time
}

// Code classifies why a message is not a chunk.
type Code string

const (
	CodeWrongSubject  Code = "wrong_subject"  // not a Run's or session's output subject
	CodeMissingHeader Code = "missing_header" // a required header is absent or empty
	CodeInvalidHeader Code = "invalid_header" // a header's value is not of its kind
	CodeEndWithData   Code = "end_with_data"  // an end mark with a body
)

// ChunkError says why a message is not a chunk. Field is the header at
// fault, or "subject" or "body".
type ChunkError struct {
	Code   Code
	Field  string
	Reason string
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("runlog: %s: %s: %s", e.Code, e.Field, e.Reason)
}

// Is makes errors.Is(err, &ChunkError{Code: c}) match any ChunkError with
// code c (and field f, when the target names one).
func (e *ChunkError) Is(target error) bool {
	t, ok := target.(*ChunkError)
	return ok && t.Code == e.Code && (t.Field == "" || t.Field == e.Field)
}

func refuse(code Code, field, format string, args ...any) *ChunkError {
	return &ChunkError{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// maxAttemptID bounds an attempt id from a session subject.
const maxAttemptID = 256

// ParseChunk decodes a WF_LOGS message. subject is the subject it was
// stored on; meta, when not nil, gives Seq and Stored. A data chunk needs
// Wf-Attempt, Wf-Stream, Wf-Offset and Wf-Time; an end mark (Wf-End, no
// body) needs Wf-Attempt, Wf-Stream and Wf-End. Wf-Node is optional. On a
// Run's subject the attempt must be one of that Run's (<run>-a<n>).
func ParseChunk(subject string, h nats.Header, data []byte, meta *jetstream.MsgMetadata) (Chunk, error) {
	c := Chunk{Data: data}
	if meta != nil {
		c.Seq, c.Stored = meta.Sequence.Stream, meta.Timestamp
	}
	runID, err := subjectRun(subject)
	if err != nil {
		return Chunk{}, err
	}
	if c.Attempt, err = one(h, bus.HeaderLogAttempt, true); err != nil {
		return Chunk{}, err
	}
	if err := checkAttempt(runID, c.Attempt); err != nil {
		return Chunk{}, err
	}
	if c.Stream, err = one(h, bus.HeaderLogStream, true); err != nil {
		return Chunk{}, err
	}
	if c.Stream != bus.LogStdout && c.Stream != bus.LogStderr {
		return Chunk{}, refuse(CodeInvalidHeader, bus.HeaderLogStream, "%s is not %s or %s", quote(c.Stream), bus.LogStdout, bus.LogStderr)
	}
	if c.Node, err = one(h, bus.HeaderLogNode, false); err != nil {
		return Chunk{}, err
	}
	end, err := one(h, bus.HeaderLogEnd, false)
	if err != nil {
		return Chunk{}, err
	}
	c.End = end != ""
	if c.End {
		if len(data) > 0 {
			return Chunk{}, refuse(CodeEndWithData, "body", "a message with %s carries no bytes; this one has %d", bus.HeaderLogEnd, len(data))
		}
		if c.Length, err = offset(bus.HeaderLogEnd, end); err != nil {
			return Chunk{}, err
		}
	}
	off, err := one(h, bus.HeaderLogOffset, !c.End)
	if err != nil {
		return Chunk{}, err
	}
	if off != "" {
		if c.Offset, err = offset(bus.HeaderLogOffset, off); err != nil {
			return Chunk{}, err
		}
		if c.Offset > math.MaxInt64-int64(len(data)) {
			return Chunk{}, refuse(CodeInvalidHeader, bus.HeaderLogOffset, "offset %d plus the body's %d bytes is past the largest stream length", c.Offset, len(data))
		}
	} else {
		c.Offset = c.Length
	}
	ts, err := one(h, bus.HeaderLogTime, !c.End)
	if err != nil {
		return Chunk{}, err
	}
	if ts != "" {
		if c.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
			return Chunk{}, refuse(CodeInvalidHeader, bus.HeaderLogTime, "%s is not an RFC 3339 time such as 2026-01-02T15:04:05.999999999Z", quote(ts))
		}
	}
	return c, nil
}

// subjectRun returns the Run id of a Run's output subject
// (bus.RunLogsSubject), "" for a session's (bus.SessionLogsSubject).
func subjectRun(subject string) (string, error) {
	parts := strings.Split(subject, ".")
	if len(parts) == 5 && parts[0]+"."+parts[1] == "wf.logs" && bus.SubjectToken(parts[2]) && bus.SubjectToken(parts[4]) {
		switch parts[3] {
		case "run":
			return parts[4], nil
		case "session":
			return "", nil
		}
	}
	return "", refuse(CodeWrongSubject, "subject", "%s is neither %s nor %s", quote(subject), bus.RunLogsSubject("<tenant>", "<run>"), bus.SessionLogsSubject("<tenant>", "<session>"))
}

// checkAttempt: on a Run's subject the attempt is <run>-a<n>, n ≥ 1.
func checkAttempt(runID, attempt string) error {
	if runID == "" {
		if len(attempt) > maxAttemptID || strings.ContainsFunc(attempt, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return refuse(CodeInvalidHeader, bus.HeaderLogAttempt, "an attempt id is at most %d bytes without spaces or control characters", maxAttemptID)
		}
		return nil
	}
	n, ok := strings.CutPrefix(attempt, runID+"-a")
	if v, err := strconv.Atoi(n); !ok || err != nil || v < 1 || strconv.Itoa(v) != n {
		return refuse(CodeInvalidHeader, bus.HeaderLogAttempt, "%s is not an attempt of run %s (%s-a<n>, n from 1)", quote(attempt), runID, runID)
	}
	return nil
}

// one returns header k's single value; required says whether it must be
// there.
func one(h nats.Header, k string, required bool) (string, error) {
	vs := h[k]
	switch {
	case len(vs) > 1:
		return "", refuse(CodeInvalidHeader, k, "given %d times; a chunk has one", len(vs))
	case len(vs) == 1 && vs[0] != "":
		return vs[0], nil
	case required:
		return "", refuse(CodeMissingHeader, k, "required on every chunk (bus/logs.go)")
	}
	return "", nil
}

// offset parses a byte offset or length: decimal digits, at most int64.
func offset(k, v string) (int64, error) {
	if strings.Trim(v, "0123456789") != "" {
		return 0, refuse(CodeInvalidHeader, k, "%s is not a decimal byte count", quote(v))
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, refuse(CodeInvalidHeader, k, "%s is past the largest stream length", quote(v))
	}
	return n, nil
}

// quote shows a value from a message, cut to 40 bytes.
func quote(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:40]) + "…"
	}
	return strconv.Quote(s)
}
