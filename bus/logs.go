package bus

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Run and session output. A node ships each workload's stdout and stderr
// to WF_LOGS in chunks of whole lines (at most MaxLogChunk bytes), one
// message per chunk, the bytes as they were written (no encoding), so
// `nats sub` and `nats stream view` show them as text. A chunk whose body
// does not end in "\n" ends mid-line (a line longer than MaxLogChunk, one
// still being written, or a last line without its newline): readers join
// it to the next chunk of its stream and add no newline. The headers say
// whose bytes they are and where they sit in their stream; Nats-Msg-Id is
// LogMsgID, so a chunk sent again after an agent restart is stored once.
// After a stream's last byte the node sends one empty message with
// HeaderLogEnd set to the stream's length.
const (
	StreamLogs = "WF_LOGS"
	// SubjectLogsAll is WF_LOGS's subjects.
	SubjectLogsAll = "wf.logs.>"

	// MaxLogChunk bounds one chunk's body; a longer line is split.
	MaxLogChunk = 64 << 10

	HeaderLogAttempt = "Wf-Attempt" // the attempt (workload) id
	HeaderLogStream  = "Wf-Stream"  // LogStdout or LogStderr
	HeaderLogOffset  = "Wf-Offset"  // decimal offset of the chunk's first byte in its stream
	HeaderLogTime    = "Wf-Time"    // RFC 3339 (nanoseconds): when the node's log writer received the first byte
	HeaderLogNode    = "Wf-Node"    // the node that ran the attempt
	HeaderLogEnd     = "Wf-End"     // on the empty closing message: the stream's length in bytes

	LogStdout = "stdout"
	LogStderr = "stderr"
)

// Defaults for Topology's WF_LOGS limits (warmfleet serve --logs-max-age,
// --logs-max-bytes, --logs-max-chunks-per-run): the oldest chunks are
// dropped first. The per-Run cap is JetStream's MaxMsgsPerSubject (the
// server has no per-subject byte limit): a Run past it loses its own oldest
// chunks, never another Run's, and holds at most that many times
// MaxLogChunk bytes (1 GiB by default). Readers see the loss as a stream
// starting past byte 0 (runlog.Gap).
const (
	DefaultLogsMaxAge          = 7 * 24 * time.Hour
	DefaultLogsMaxBytes        = 10 << 30
	DefaultLogsMaxChunksPerRun = 16384
)

// LogMsgID is the Nats-Msg-Id of the chunk of attempt's stream that starts
// at offset: the same bytes sent again are the same message.
func LogMsgID(attempt, stream string, offset int64) string {
	return attempt + "." + stream + "." + strconv.FormatInt(offset, 10)
}

// LogEndMsgID is the Nats-Msg-Id of a stream's closing message.
func LogEndMsgID(attempt, stream string) string { return attempt + "." + stream + ".end" }

// LogChunkMsg is one chunk of attempt's stream on subject, as WF_LOGS
// keeps it: data starting at offset, written by node, its first byte
// received at at (no time header when zero).
func LogChunkMsg(subject, attempt, stream, node string, offset int64, at time.Time, data []byte) *nats.Msg {
	m := logMsg(subject, attempt, stream, node)
	m.Data = data
	m.Header.Set(HeaderLogOffset, strconv.FormatInt(offset, 10))
	if !at.IsZero() {
		m.Header.Set(HeaderLogTime, at.UTC().Format(time.RFC3339Nano))
	}
	return m
}

// LogEndMsg closes attempt's stream on subject at size bytes.
func LogEndMsg(subject, attempt, stream, node string, size int64) *nats.Msg {
	m := logMsg(subject, attempt, stream, node)
	m.Header.Set(HeaderLogEnd, strconv.FormatInt(size, 10))
	return m
}

func logMsg(subject, attempt, stream, node string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(HeaderLogAttempt, attempt)
	m.Header.Set(HeaderLogStream, stream)
	m.Header.Set(HeaderLogNode, node)
	return m
}

// logsStreamConfig keeps output by age and size (limits retention): logs
// outlive their Run and its node, and the oldest go first.
func (t Topology) logsStreamConfig(r int) jetstream.StreamConfig {
	age, size, perRun := t.LogsMaxAge, t.LogsMaxBytes, t.LogsMaxChunksPerRun
	if age == 0 {
		age = DefaultLogsMaxAge
	}
	if size == 0 {
		size = DefaultLogsMaxBytes
	}
	if perRun == 0 {
		perRun = DefaultLogsMaxChunksPerRun
	}
	return jetstream.StreamConfig{
		Name:        StreamLogs,
		Description: "Run and session output, in chunks of whole lines",
		Subjects:    []string{SubjectLogsAll},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      age,
		MaxBytes:    size,
		// One subject per Run (and per session): one Run's output cannot
		// evict another's. Provision's CreateOrUpdateStream sets it on a
		// stream made before the cap existed.
		MaxMsgsPerSubject: perRun,
		MaxMsgSize:        MaxLogChunk + 4<<10, // the body and its headers
		Duplicates:        DedupeWindow,
		Replicas:          r,
	}
}
