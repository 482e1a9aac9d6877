package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// DefaultJournalRetention is how many operations the journal remembers.
//
// Retention rule: the newest N operations are kept; older ones are
// forgotten when the file is compacted (at 2N lines). A duplicate reaches an
// agent only while its command is unacked (JetStream redelivery) or within
// the stream's dedupe window of a resend, both far shorter than N
// operations; past that, the runtime's own idempotency (a workload id exists
// once) still prevents a second container.
const DefaultJournalRetention = 4096

// JournalEntry is one applied operation.
type JournalEntry struct {
	OperationID string              `json:"operation_id"`
	Kind        schemas.CommandKind `json:"kind"`
	RunID       string              `json:"run_id,omitempty"`
	AttemptID   string              `json:"attempt_id,omitempty"`
	Outcome     string              `json:"outcome"`
	Code        schemas.Code        `json:"code,omitempty"`
	Message     string              `json:"message,omitempty"`
	// StopReason is kept for stops, so an exit reported after a restart
	// still says why the workload ended.
	StopReason string    `json:"stop_reason,omitempty"`
	AppliedAt  time.Time `json:"applied_at"`
}

// Journal is the agent's durable record of applied operations: an
// append-only JSON-lines file, fsynced before a command whose repeat would
// be a second effect is acked (syncBeforeAck), compacted when it grows
// past twice its retention.
type Journal struct {
	// syncMu orders fsyncs; mu guards the rest and is never held across an
	// fsync, so a Lookup or Append for the next command does not wait for
	// the disk to flush the last one.
	syncMu sync.Mutex
	// synced counts the appends known to be on disk (under syncMu).
	synced uint64
	mu     sync.Mutex
	// appended counts every append since open (under mu).
	appended uint64
	// end is the length of the file's whole lines when it was opened.
	end       int64
	path      string
	f         *os.File
	retention int
	lines     int
	order     []string
	byOp      map[string]JournalEntry
	stopped   map[string]JournalEntry // attempt id → its stop entry
}

// OpenJournal opens (or creates) the journal in dir.
func OpenJournal(dir string, retention int) (*Journal, error) {
	if retention <= 0 {
		retention = DefaultJournalRetention
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j := &Journal{path: filepath.Join(dir, "operations.jsonl"), retention: retention, byOp: map[string]JournalEntry{}, stopped: map[string]JournalEntry{}}
	if err := j.load(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: open %s: %w", j.path, err)
	}
	// A torn last line is cut off: appended after, it would swallow the
	// next entry into one line that does not decode.
	if err := f.Truncate(j.end); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("journal: cut torn tail: %w", err)
	}
	j.f = f
	return j, nil
}

// load reads the entries up to the first line that does not end in a
// newline (a torn write), and sets end just before it.
func (j *Journal) load() error {
	b, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	for {
		n := bytes.IndexByte(b[j.end:], '\n')
		if n < 0 {
			return nil
		}
		var e JournalEntry
		// A line that does not decode is skipped: its operation was not
		// acked, so it will be delivered again.
		if json.Unmarshal(b[j.end:j.end+int64(n)], &e) == nil && e.OperationID != "" {
			j.remember(e)
		}
		j.lines++
		j.end += int64(n) + 1
	}
}

func (j *Journal) remember(e JournalEntry) {
	if _, ok := j.byOp[e.OperationID]; !ok {
		j.order = append(j.order, e.OperationID)
	}
	j.byOp[e.OperationID] = e
	if e.Kind == schemas.CmdStopWorkload && e.AttemptID != "" {
		j.stopped[e.AttemptID] = e
	}
	for len(j.order) > j.retention {
		old := j.byOp[j.order[0]]
		delete(j.byOp, j.order[0])
		if s, ok := j.stopped[old.AttemptID]; ok && s.OperationID == old.OperationID {
			delete(j.stopped, old.AttemptID)
		}
		j.order = j.order[1:]
	}
}

// Lookup returns the entry for an operation id, if it was applied.
func (j *Journal) Lookup(op string) (JournalEntry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.byOp[op]
	return e, ok
}

// Stopped returns the stop entry of an attempt, if one was applied.
func (j *Journal) Stopped(attemptID string) (JournalEntry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.stopped[attemptID]
	return e, ok
}

// Record durably appends e. It returns only after the entry is on disk.
func (j *Journal) Record(e JournalEntry) error {
	if err := j.Append(e); err != nil {
		return err
	}
	return j.Sync()
}

// Append writes e to the file and remembers it, without waiting for the
// disk: the entry survives this process dying, and Sync makes it survive
// the machine. Splitting the two lets the agent send a receipt while the
// disk flushes; it still acks the command only after Sync.
func (j *Journal) Append(e JournalEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("journal: append: %w", err)
	}
	j.remember(e)
	j.lines++
	j.appended++
	if j.lines > 2*j.retention {
		return j.compact()
	}
	return nil
}

// Sync flushes every entry appended before it was called to disk. Syncs
// commit as a group: one that finds an fsync begun after its entries were
// written has nothing left to do, so a burst of commands costs a few
// fsyncs, not one each in a queue.
func (j *Journal) Sync() error {
	j.mu.Lock()
	want := j.appended
	j.mu.Unlock()
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= want {
		return nil
	}
	j.mu.Lock()
	f, upto := j.f, j.appended
	j.mu.Unlock()
	if err := syncFile(f); err != nil {
		return err
	}
	j.synced = upto
	return nil
}

// syncFile fsyncs the journal file f. Finding f closed means a compaction
// replaced it, after writing every retained entry to the new file and
// syncing that: nothing appended to f is left unsynced.
func syncFile(f *os.File) error {
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("journal: sync: %w", err)
	}
	return nil
}

// compact rewrites the file with only the retained entries, atomically.
func (j *Journal) compact() error {
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, op := range j.order {
		b, _ := json.Marshal(j.byOp[op])
		_, _ = w.Write(append(b, '\n'))
	}
	if err := errors.Join(w.Flush(), f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	nf, err := os.OpenFile(j.path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("journal: reopen: %w", err)
	}
	_ = j.f.Close()
	j.f, j.lines = nf, len(j.order)
	return nil
}

// Applied lists the retained operation ids, oldest first.
func (j *Journal) Applied() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.order...)
}

// Close closes the file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.f.Close()
}
