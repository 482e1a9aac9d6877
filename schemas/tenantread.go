package schemas

import (
	"strings"
	"time"
)

// The per-tenant read services' wire types (wf.tenant.<tenant>.runs.get,
// .runs.list, .runs.read). A producer may read stored history only through
// them: its login has no JetStream API, and the control plane builds every
// key and subject it reads from the tenant of the request's subject.

// Bounds of the read services' requests and replies.
const (
	// DefaultRunsList and MaxRunsList bound runs.list's Runs per reply.
	DefaultRunsList = 100
	MaxRunsList     = 1000
	// MaxReadMessages bounds runs.read's page; MaxReadPageBytes bounds the
	// bodies and headers of its messages together (one message may exceed
	// it alone: a page holds at least one; a WF_LOGS chunk is ≤ 68 KiB).
	MaxReadMessages  = 256
	MaxReadPageBytes = 256 << 10
	// MaxReadWait bounds how long runs.read waits for a message past
	// start_seq before answering an empty page.
	MaxReadWait = 10 * time.Second
)

// The kinds of stored messages runs.read reads.
const (
	ReadEvents      = "events"       // a Run's events (WF_EVENTS)
	ReadLogs        = "logs"         // a Run's output (WF_LOGS)
	ReadSessionLogs = "session_logs" // a resident session's output (WF_LOGS)
)

// RunsGetRequest asks runs.get for one Run of the subject's tenant.
type RunsGetRequest struct {
	RunID string `json:"run_id"`
}

// Validate checks the Run id is one subject token.
func (r *RunsGetRequest) Validate() error { return validateToken("run_id", r.RunID, CodeInvalidRunID) }

// RunsListRequest asks runs.list for the subject's tenant's Runs, newest
// first.
type RunsListRequest struct {
	Phase Phase `json:"phase,omitempty"` // only Runs in this phase; "" every phase
	Limit int   `json:"limit,omitempty"` // at most this many; 0 is DefaultRunsList
}

// Validate checks the phase and the limit.
func (r *RunsListRequest) Validate() error {
	switch r.Phase {
	case "", PhaseAccepted, PhasePlaced, PhasePreparing, PhaseLaunching, PhaseRunning, PhaseSucceeded, PhaseFailed, PhaseCancelled, PhaseLost:
	default:
		return refuse(CodeMalformed, "phase", "not a phase; use accepted, placed, preparing, launching, running, succeeded, failed, cancelled or lost")
	}
	if r.Limit < 0 || r.Limit > MaxRunsList {
		return refuse(CodeTooManyItems, "limit", "must be 0 (the default, %d) to %d", DefaultRunsList, MaxRunsList)
	}
	return nil
}

// RunsList is runs.list's answer: the Runs (outbox left out) and how many
// more of the tenant's Runs matched but were left off (the limit, or the
// reply's size bound).
type RunsList struct {
	Runs    []Run `json:"runs"`
	LeftOff int   `json:"left_off,omitempty"`
}

// RunsReadRequest asks runs.read for a page of stored messages of one
// subject of the subject's tenant: a Run's events or output (RunID) or a
// session's output (Session).
type RunsReadRequest struct {
	Kind    string `json:"kind"`
	RunID   string `json:"run_id,omitempty"`
	Session string `json:"session,omitempty"`
	// StartSeq is the first stream sequence to read; 0 reads from
	// StartTime, or from the first message stored.
	StartSeq  uint64     `json:"start_seq,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	// Max is how many messages to answer at most (≤ MaxReadMessages); 0
	// answers none, only the subject's last sequence.
	Max int `json:"max,omitempty"`
	// WaitMillis, when no message is stored from the start, waits up to
	// this long (≤ MaxReadWait) for one: a follower's long poll.
	WaitMillis int64 `json:"wait_ms,omitempty"`
}

// Validate checks the kind names its subject and the bounds.
func (r *RunsReadRequest) Validate() error {
	switch r.Kind {
	case ReadEvents, ReadLogs:
		if r.Session != "" {
			return refuse(CodeMalformed, "session", "only with kind %q; a Run's %s are named by run_id", ReadSessionLogs, r.Kind)
		}
		if err := validateToken("run_id", r.RunID, CodeInvalidRunID); err != nil {
			return err
		}
	case ReadSessionLogs:
		if r.RunID != "" {
			return refuse(CodeMalformed, "run_id", "not with kind %q, which names a session", ReadSessionLogs)
		}
		if err := validateToken("session", r.Session, CodeMalformed); err != nil {
			return err
		}
	case "":
		return refuse(CodeMissingField, "kind", "required: %s, %s or %s", ReadEvents, ReadLogs, ReadSessionLogs)
	default:
		return refuse(CodeMalformed, "kind", "must be %s, %s or %s", ReadEvents, ReadLogs, ReadSessionLogs)
	}
	if r.StartSeq > 0 && r.StartTime != nil {
		return refuse(CodeMalformed, "start_time", "give start_seq or start_time, not both")
	}
	if r.Max < 0 || r.Max > MaxReadMessages {
		return refuse(CodeTooManyItems, "max", "must be 0 (the last sequence only) to %d messages", MaxReadMessages)
	}
	if r.WaitMillis < 0 || r.WaitMillis > MaxReadWait.Milliseconds() {
		return refuse(CodeMalformed, "wait_ms", "must be 0 to %d milliseconds", MaxReadWait.Milliseconds())
	}
	return nil
}

// StoredMsg is one stored message as runs.read answers it.
type StoredMsg struct {
	Seq     uint64              `json:"seq"`
	Time    time.Time           `json:"time"`
	Headers map[string][]string `json:"headers,omitempty"`
	Data    []byte              `json:"data,omitempty"`
}

// ReadPage is runs.read's answer: the messages from the start, in stream
// order, and the sequence (and store time) of the subject's last stored
// message, 0 when it holds none. A page shorter than Max is not the end:
// a follower asks again from its last message's sequence + 1.
type ReadPage struct {
	Messages []StoredMsg `json:"messages"`
	LastSeq  uint64      `json:"last_seq"`
	LastTime *time.Time  `json:"last_time,omitempty"`
}

// validateToken checks an id that becomes one subject token: ValidateID's
// characters without the dot.
func validateToken(field, id string, code Code) error {
	if err := ValidateID(field, id, code); err != nil {
		return err
	}
	if strings.Contains(id, ".") {
		return refuse(code, field, "must be 1-128 characters of [A-Za-z0-9_:-] (no dots), starting with a letter or digit")
	}
	return nil
}
