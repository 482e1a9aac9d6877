package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestJournalSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Record(JournalEntry{OperationID: "a.launch", Kind: schemas.CmdLaunchWorkload, AttemptID: "a", Outcome: schemas.OutcomeApplied, AppliedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := j.Record(JournalEntry{OperationID: "a.stop", Kind: schemas.CmdStopWorkload, AttemptID: "a", Outcome: schemas.OutcomeApplied, StopReason: "cancelled"}); err != nil {
		t.Fatal(err)
	}
	_ = j.Close()

	// A crash mid-write leaves a torn last line: it is skipped, the rest kept.
	f, err := os.OpenFile(filepath.Join(dir, "operations.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"operation_id":"torn`)
	_ = f.Close()

	j, err = OpenJournal(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, ok := j.Lookup("a.launch"); !ok {
		t.Fatal("applied operation forgotten across reopen")
	}
	if e, ok := j.Stopped("a"); !ok || e.StopReason != "cancelled" {
		t.Fatalf("stop of attempt a: %+v %v", e, ok)
	}
	if _, ok := j.Lookup("torn"); ok {
		t.Fatal("a torn entry was taken as applied")
	}
	// The journal still appends after a torn line, and the entry is read
	// back: the torn tail was cut, not prefixed to it.
	if err := j.Record(JournalEntry{OperationID: "b.launch", Outcome: schemas.OutcomeApplied}); err != nil {
		t.Fatal(err)
	}
	_ = j.Close()
	if j, err = OpenJournal(dir, 0); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, op := range []string{"a.launch", "a.stop", "b.launch"} {
		if _, ok := j.Lookup(op); !ok {
			t.Fatalf("%s lost across a reopen after a torn entry (have %v)", op, j.Applied())
		}
	}
}

func TestJournalRetentionAndCompaction(t *testing.T) {
	dir := t.TempDir()
	const keep = 10
	j, err := OpenJournal(dir, keep)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3*keep + 1 {
		if err := j.Record(JournalEntry{OperationID: fmt.Sprintf("op-%d", i), Outcome: schemas.OutcomeApplied}); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(j.Applied()); got != keep {
		t.Fatalf("retains %d operations, want %d", got, keep)
	}
	if _, ok := j.Lookup("op-0"); ok {
		t.Fatal("the oldest operation outlived retention")
	}
	if _, ok := j.Lookup(fmt.Sprintf("op-%d", 3*keep)); !ok {
		t.Fatal("the newest operation is missing")
	}
	_ = j.Close()
	// The file was compacted: it holds at most 2×retention lines, and a
	// reopen sees the same operations.
	b, err := os.ReadFile(filepath.Join(dir, "operations.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, c := range b {
		if c == '\n' {
			lines++
		}
	}
	if lines > 2*keep {
		t.Fatalf("journal file has %d lines; compaction should bound it by %d", lines, 2*keep)
	}
	j, err = OpenJournal(dir, keep)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got := len(j.Applied()); got != keep {
		t.Fatalf("after reopen: %d operations, want %d", got, keep)
	}
}

// TestJournalSyncAcrossCompaction: Sync holds no lock across the fsync, so a
// compaction may replace and close the file a Sync is flushing. That Sync
// still succeeds (the compaction synced every retained entry into the new
// file), and concurrent appends, syncs and lookups lose nothing retained.
func TestJournalSyncAcrossCompaction(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir, 8)
	if err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	old := j.f
	j.mu.Unlock()
	for i := range 17 { // past 2×8 lines: one compaction
		op := fmt.Sprintf("op-%02d", i)
		if err := j.Append(JournalEntry{OperationID: op, Outcome: schemas.OutcomeApplied}); err != nil {
			t.Fatal(err)
		}
		if _, ok := j.Lookup(op); !ok {
			t.Fatalf("%s not found right after its append", op)
		}
	}
	j.mu.Lock()
	replaced := j.f != old
	j.mu.Unlock()
	if !replaced {
		t.Fatal("no compaction after 17 appends at retention 8")
	}
	if err := syncFile(old); err != nil {
		t.Fatalf("sync of the file a compaction replaced: %v", err)
	}

	// Four writers at once: between one's append and a lookup the others
	// may append past the retention, so only the reopened journal's
	// entries are checked below.
	var wg sync.WaitGroup
	errs := make(chan error, 4*50)
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				op := fmt.Sprintf("w%d-%02d", w, i)
				if err := j.Append(JournalEntry{OperationID: op, Outcome: schemas.OutcomeApplied}); err != nil {
					errs <- err
					return
				}
				if err := j.Sync(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every append was followed by a Sync that returned, so the group
	// commit's count of synced entries has caught up with the appends.
	j.syncMu.Lock()
	j.mu.Lock()
	synced, appended := j.synced, j.appended
	j.mu.Unlock()
	j.syncMu.Unlock()
	if synced != appended || appended != 17+4*50 {
		t.Fatalf("synced %d of %d appends (want all %d)", synced, appended, 17+4*50)
	}
	want := j.Applied()
	_ = j.Close()
	j, err = OpenJournal(dir, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, op := range want {
		if _, ok := j.Lookup(op); !ok {
			t.Fatalf("retained %s lost across reopen (retained %v)", op, want)
		}
	}
}

// FuzzJournalLoad: whatever a crash left in the file, the journal opens,
// keeps what it read, and an entry recorded next survives a reopen.
func FuzzJournalLoad(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte(`{"operation_id":"a","outcome":"applied"}` + "\n"))
	f.Add([]byte(`{"operation_id":"a","outcome":"applied"}` + "\n" + `{"operation_id":"torn`))
	f.Add([]byte("not json\n{\"operation_id\":\"\"}\n\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "operations.jsonl"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		j, err := OpenJournal(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		had := j.Applied()
		if err := j.Record(JournalEntry{OperationID: "fuzz.next", Outcome: schemas.OutcomeApplied}); err != nil {
			t.Fatal(err)
		}
		_ = j.Close()
		if j, err = OpenJournal(dir, 0); err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		for _, op := range append(had, "fuzz.next") {
			if _, ok := j.Lookup(op); !ok {
				t.Fatalf("%q lost across a reopen (file %q)", op, data)
			}
		}
	})
}

// TestJournalAppendSurvivesProcessDeath: an entry appended and never
// synced is read back by the next process, which opens the file while the
// dead one never closed it. Prepares are acked on this (syncBeforeAck): the
// append must reach the file, not a buffer in the process.
func TestJournalAppendSurvivesProcessDeath(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	if err := j.Append(JournalEntry{OperationID: "p.prepare", Kind: schemas.CmdPrepareImage, Outcome: schemas.OutcomeApplied}); err != nil {
		t.Fatal(err)
	}
	next, err := OpenJournal(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if e, ok := next.Lookup("p.prepare"); !ok || e.Outcome != schemas.OutcomeApplied {
		t.Fatalf("an appended, unsynced entry was not read back: %+v %v", e, ok)
	}
}

func TestSyncBeforeAck(t *testing.T) {
	for k, want := range map[schemas.CommandKind]bool{
		schemas.CmdPrepareImage: false, schemas.CmdPrepareArtifact: false,
		schemas.CmdLaunchWorkload: true, schemas.CmdStopWorkload: true, schemas.CmdReconcile: true,
	} {
		if got := syncBeforeAck(k); got != want {
			t.Errorf("syncBeforeAck(%s) = %v, want %v", k, got, want)
		}
	}
}
