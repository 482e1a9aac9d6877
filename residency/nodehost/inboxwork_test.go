package nodehost

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/residency"
)

// grant is a Guard whose grant a test takes away.
type grant struct{ lost atomic.Bool }

func (g *grant) Check() error {
	if g.lost.Load() {
		return residency.ErrStaleEpoch
	}
	return nil
}
func (g *grant) Epoch() residency.ResidencyEpoch { return 3 }

func work(g residency.Guard, id string, stopping <-chan struct{}, progress *atomic.Int32) residency.Work {
	return residency.Work{Key: residency.Key{Tenant: "acme", Session: "s1"}, MsgID: id, Data: []byte("body of " + id),
		Guard: g, Stopping: stopping, InProgress: func() error { progress.Add(1); return nil }}
}

// handle runs h in the background and returns its answer's channel.
func handle(h residency.Handler, w residency.Work) <-chan error {
	out := make(chan error, 1)
	go func() { out <- h(context.Background(), w) }()
	return out
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never written", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWorkspaceHandler_AcksWhenTheRuntimeFinished(t *testing.T) {
	root := t.TempDir()
	g := &grant{}
	var progress atomic.Int32
	done := handle(WorkspaceHandler(root, AckWhenDone), work(g, "m-1", nil, &progress))
	path := filepath.Join(root, "acme", "s1", "inbox", "m-1")
	waitFile(t, path)
	if body, _ := os.ReadFile(path); string(body) != "body of m-1" {
		t.Fatalf("work file holds %q", body)
	}
	select {
	case err := <-done:
		t.Fatalf("handler returned %v before the runtime finished", err)
	case <-time.After(1200 * time.Millisecond):
	}
	if progress.Load() == 0 {
		t.Error("work waited over a second and was never reported in progress")
	}
	if err := os.Remove(path); err != nil { // the runtime's signal
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("finished work: %v, want nil (ack)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler still waiting after the runtime removed the work")
	}
}

func TestWorkspaceHandler_HandsBackUnfinishedWork(t *testing.T) {
	root := t.TempDir()
	var progress atomic.Int32
	t.Run("consumption stops", func(t *testing.T) {
		stopping := make(chan struct{})
		done := handle(WorkspaceHandler(root, AckWhenDone), work(&grant{}, "m-2", stopping, &progress))
		waitFile(t, filepath.Join(root, "acme", "s1", "inbox", "m-2"))
		close(stopping)
		if err := <-done; !errors.Is(err, residency.ErrWorkUnfinished) {
			t.Fatalf("stopped while unfinished: %v, want ErrWorkUnfinished", err)
		}
	})
	t.Run("grant lost", func(t *testing.T) {
		g := &grant{}
		done := handle(WorkspaceHandler(root, AckWhenDone), work(g, "m-3", nil, &progress))
		waitFile(t, filepath.Join(root, "acme", "s1", "inbox", "m-3"))
		g.lost.Store(true)
		if err := <-done; !errors.Is(err, residency.ErrStaleEpoch) {
			t.Fatalf("grant lost while waiting: %v, want ErrStaleEpoch", err)
		}
	})
	t.Run("redelivered work overwrites its file", func(t *testing.T) {
		stopping := make(chan struct{})
		close(stopping)
		w := work(&grant{}, "m-2", stopping, &progress)
		w.Data = []byte("again")
		if err := WorkspaceHandler(root, AckWhenDone)(context.Background(), w); !errors.Is(err, residency.ErrWorkUnfinished) {
			t.Fatalf("redelivery: %v", err)
		}
		if body, _ := os.ReadFile(filepath.Join(root, "acme", "s1", "inbox", "m-2")); string(body) != "again" {
			t.Fatalf("redelivered work file holds %q", body)
		}
	})
}

func TestWorkspaceHandler_AckWhenWritten(t *testing.T) {
	root := t.TempDir()
	var progress atomic.Int32
	if err := WorkspaceHandler(root, AckWhenWritten)(context.Background(), work(&grant{}, "m-4", nil, &progress)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "acme", "s1", "inbox", "m-4")); err != nil {
		t.Fatalf("written work: %v", err)
	}
	g := &grant{}
	g.lost.Store(true)
	if err := WorkspaceHandler(root, AckWhenWritten)(context.Background(), work(g, "m-5", nil, &progress)); !errors.Is(err, residency.ErrStaleEpoch) {
		t.Fatalf("without the grant: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "acme", "s1", "inbox", "m-5")); !os.IsNotExist(err) {
		t.Fatalf("work written without the grant: %v", err)
	}
}

func TestWorkspaceHandler_HostileMessageIDs(t *testing.T) {
	root := t.TempDir()
	var progress atomic.Int32
	for _, id := range []string{"", ".", "..", "../../escape", `a\b`, ".hidden"} {
		if err := WorkspaceHandler(root, AckWhenWritten)(context.Background(), work(&grant{}, id, nil, &progress)); err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(root, "acme", "s1", "inbox"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name()[0] == '.' || filepath.Base(e.Name()) != e.Name() {
			t.Errorf("inbox entry %q from a hostile id", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(root, "escape")); !os.IsNotExist(err) {
		t.Errorf("a message id escaped the inbox: %v", err)
	}
}

func TestInboxAckValidate(t *testing.T) {
	for _, ok := range []InboxAck{"", AckWhenDone, AckWhenWritten} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	var inv *residency.InvalidOptionsError
	if err := InboxAck("later").Validate(); !errors.As(err, &inv) || inv.Field != "InboxAck" {
		t.Errorf("unknown mode: %v", err)
	}
}
