package agent

import (
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

// Journal is the agent's durable record of applied operations: a
// JSON-lines file, synced before each command is acked, compacted when it
// grows past twice its retention.
//
// The file is grown ahead of its entries in zero-filled steps
// (journalGrowBytes), and entries overwrite the zeros. Appending to a file
// changes its size, and every sync of a size change commits the
// filesystem's own journal too; an overwrite inside the file needs only
// fdatasync of the data block, so a command's sync costs the disk one write.
// A step's full fsync is paid once per journalGrowBytes.
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
	// end is where the next entry is written; size is the file's size,
	// zeros from end on; grown says the size changed since the last sync,
	// which then must be a full fsync (all under mu).
	end, size int64
	grown     bool
	path      string
	f         *os.File
	retention int
	lines     int
	order     []string
	byOp      map[string]JournalEntry
	stopped   map[string]JournalEntry // attempt id → its stop entry
}

// journalGrowBytes is the zero-filled step the file grows by: about 4,000
// entries.
const journalGrowBytes = 1 << 20

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
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: open %s: %w", j.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("journal: %w", err)
	}
	j.f, j.size = f, st.Size()
	return j, nil
}

// load reads the entries up to the first line that does not end in a
// newline or starts with a zero byte: the rest is a torn write or the
// zeros the file was grown by, and the next entry overwrites it.
func (j *Journal) load() error {
	b, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	for len(b) > int(j.end) && b[j.end] != 0 {
		n := bytes.IndexByte(b[j.end:], '\n')
		if n < 0 {
			break
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
	return nil
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
	b = append(b, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.reserve(int64(len(b))); err != nil {
		return err
	}
	if _, err := j.f.WriteAt(b, j.end); err != nil {
		return fmt.Errorf("journal: append: %w", err)
	}
	j.end += int64(len(b))
	j.remember(e)
	j.lines++
	j.appended++
	if j.lines > 2*j.retention {
		return j.compact()
	}
	return nil
}

// reserve grows the file by zero-filled steps until n more bytes fit
// (under mu).
func (j *Journal) reserve(n int64) error {
	for j.end+n > j.size {
		if _, err := j.f.WriteAt(make([]byte, journalGrowBytes), j.size); err != nil {
			return fmt.Errorf("journal: grow: %w", err)
		}
		j.size += journalGrowBytes
		j.grown = true
	}
	return nil
}

// Sync flushes every entry appended before it was called to disk. Syncs
// commit as a group: one that finds a sync begun after its entries were
// written has nothing left to do, so a burst of commands costs a few
// syncs, not one each in a queue.
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
	f, upto, full := j.f, j.appended, j.grown
	j.grown = false
	j.mu.Unlock()
	if err := syncFile(f, full); err != nil {
		if full {
			j.mu.Lock()
			j.grown = j.grown || j.f == f
			j.mu.Unlock()
		}
		return err
	}
	j.synced = upto
	return nil
}

// syncFile flushes the journal file f: its data alone (fdatasync), or with
// its size when full. Finding f closed means a compaction replaced it,
// after writing every retained entry to the new file and syncing that:
// nothing written to f is left unsynced.
func syncFile(f *os.File, full bool) error {
	var err error
	if full {
		err = f.Sync()
	} else {
		err = datasync(f)
	}
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("journal: sync: %w", err)
	}
	return nil
}

// compact rewrites the file with only the retained entries, atomically,
// grown as Append grows it.
func (j *Journal) compact() error {
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	var buf bytes.Buffer
	for _, op := range j.order {
		b, _ := json.Marshal(j.byOp[op])
		buf.Write(append(b, '\n'))
	}
	end := int64(buf.Len())
	size := (end/journalGrowBytes + 1) * journalGrowBytes
	buf.Write(make([]byte, size-end))
	_, werr := f.Write(buf.Bytes())
	if err := errors.Join(werr, f.Sync()); err != nil {
		_ = f.Close()
		return fmt.Errorf("journal: compact: %w", err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		_ = f.Close()
		return fmt.Errorf("journal: compact: %w", err)
	}
	_ = j.f.Close()
	j.f, j.lines, j.end, j.size, j.grown = f, len(j.order), end, size, false
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
