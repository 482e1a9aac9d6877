package agent

import (
	"fmt"
	"os"
	"path/filepath"
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
	// The journal still appends after a torn line.
	if err := j.Record(JournalEntry{OperationID: "b.launch", Outcome: schemas.OutcomeApplied}); err != nil {
		t.Fatal(err)
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
