package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// inboxWorker is a session runtime that does its inbox work: each file in
// /workspace/inbox is logged as processed, its effect is written once per
// message id, and the file is removed (the node acks it then). While
// /workspace/hold exists it takes nothing new.
const inboxWorker = `cd /workspace || exit 1
mkdir -p effects
while :; do
  for f in inbox/*; do
    [ -e hold ] && break
    [ -f "$f" ] || continue
    id=${f#inbox/}
    echo "$id $WF_LEASE_EPOCH" >> processed.log
    [ -e "effects/$id" ] || { echo "$WF_LEASE_EPOCH" > "effects/.$id"; mv "effects/.$id" "effects/$id"; }
    rm -f "$f"
  done
  sleep 0.05
done`

// TestAcceptance_InboxWorkNotLostOnRelease, on real containerd: 100 inbox
// messages; the session is released while one is in its runtime's hands
// and unfinished. That one goes back to WF_INBOX (it was never acked), is
// delivered again to the next holder, and finished there; every message is
// processed at least once, each effect is made once, and each message is
// acked once.
func TestAcceptance_InboxWorkNotLostOnRelease(t *testing.T) {
	w := newWorld(t)
	f := sessionFleet(t)
	l := newLedger(t)
	target := residency.RuntimeTarget{Image: w.image.Reference, ManifestDigest: w.image.ManifestDigest,
		Command: []string{"sh", "-c", inboxWorker}, CompatibilityID: sessCompat, StopGrace: 100 * time.Millisecond}
	a := f.startSessionNode(sessionNodeSpec{id: "node-a", rt: f.containerdRuntime(w, "node-a"), target: target, ledger: l, ackWhenDone: true})
	b := f.startSessionNode(sessionNodeSpec{id: "node-b", rt: f.containerdRuntime(w, "node-b"), target: target, ledger: l, ackWhenDone: true})
	key := residency.Key{Tenant: "acme", Session: "work-1"}
	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: a.id}); r.Host != a.id || r.Epoch != 1 {
		t.Fatalf("attach: %+v", r)
	}
	const total = 100
	for i := range total {
		f.publishWork(key, fmt.Sprintf("m-%03d", i))
	}
	f.eventually(60*time.Second, "node-a's runtime to finish 40 messages", func() bool { return l.count() >= 40 })

	// The runtime stops taking work; the message the node hands it next
	// stays unfinished in its inbox.
	wsA := filepath.Join(a.ws, key.Tenant, key.Session)
	if err := os.WriteFile(filepath.Join(wsA, "hold"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var held string
	f.eventually(20*time.Second, "a message in node-a's runtime, unfinished", func() bool {
		names := visibleNames(t, filepath.Join(wsA, "inbox"))
		if len(names) != 1 {
			return false
		}
		held = names[0]
		return true
	})
	if rep := f.sessionAdmin(bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); rep.Error != nil {
		t.Fatalf("release: %v", rep.Error)
	}
	if got := l.returned(held); len(got) != 1 || got[0] != "node-a@1" {
		t.Fatalf("%s handed back by %v, want once by node-a@1", held, got)
	}
	if got := l.handled(held); len(got) != 0 {
		t.Fatalf("unfinished %s acked by %v", held, got)
	}
	doneAtRelease := l.count()

	// The next holder restores the workspace (hold included), is handed the
	// unfinished message again, and acks nothing until its runtime works.
	if r := f.attachSession(schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session, Node: b.id}); r.Host != b.id || r.Epoch != 2 {
		t.Fatalf("attach on node-b: %+v", r)
	}
	wsB := filepath.Join(b.ws, key.Tenant, key.Session)
	f.eventually(20*time.Second, held+" delivered again to node-b", func() bool {
		_, err := os.Stat(filepath.Join(wsB, "inbox", held))
		return err == nil
	})
	if n := l.count(); n != doneAtRelease {
		t.Fatalf("%d messages acked while node-b's runtime held its work, want %d", n, doneAtRelease)
	}
	if err := os.Remove(filepath.Join(wsB, "hold")); err != nil {
		t.Fatal(err)
	}
	f.eventually(90*time.Second, "every message finished", func() bool { return l.count() == total })

	for i := range total {
		id := fmt.Sprintf("m-%03d", i)
		if got := l.handled(id); len(got) != 1 {
			t.Errorf("%s acked %d times (%v), want once", id, len(got), got)
		}
		effect, err := os.ReadFile(filepath.Join(wsB, "effects", id))
		if err != nil || strings.Count(string(effect), "\n") != 1 {
			t.Errorf("effect of %s on node-b: %q, %v; want one line", id, effect, err)
		}
	}
	if got := l.handled(held); len(got) != 1 || got[0] != "node-b@2" {
		t.Errorf("%s acked by %v, want node-b@2", held, got)
	}
	if d := l.delivered(held); d < 2 {
		t.Errorf("%s delivered %d times, want at least 2", held, d)
	}
	if effect, _ := os.ReadFile(filepath.Join(wsB, "effects", held)); string(effect) != "2\n" {
		t.Errorf("effect of %s: %q, want made at epoch 2", held, effect)
	}
	processed, err := os.ReadFile(filepath.Join(wsB, "processed.log"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range total {
		if id := fmt.Sprintf("m-%03d ", i); !strings.Contains(string(processed), id) {
			t.Errorf("%s never processed (processed.log, restored and continued on node-b)", strings.TrimSpace(id))
		}
	}
	if left := visibleNames(t, filepath.Join(wsB, "inbox")); len(left) != 0 {
		t.Errorf("work left in node-b's inbox: %v", left)
	}
	l.checkNoOverlap()
}

// visibleNames lists dir's entries whose names do not start with a dot.
func visibleNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}
