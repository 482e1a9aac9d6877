package prefetch

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestWantsFollowsEntriesAndDeadline: Wants is true only for a node whose
// entry is open in a prefetch before its deadline, follows newer revisions
// of the record, ignores older ones, and a pruned copy wants nothing.
func TestWantsFollowsEntriesAndDeadline(t *testing.T) {
	now := t0
	s := New(nil, nil, nil, nil, 0, func() time.Time { return now }, zap.NewNop())
	image := "registry.test/team/model@" + digest
	ref, err := schemas.ParseImageRef("image", image)
	if err != nil {
		t.Fatal(err)
	}
	other := ref
	other.Digest = "sha256:" + strings.Repeat("0", 64)
	elsewhere := ref
	elsewhere.Name = "other.test/team/model" // same digest, another registry
	p := schemas.Prefetch{ID: "pf-1", Image: image, ManifestDigest: digest, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), Nodes: []schemas.PrefetchNode{
		{NodeID: "a", State: schemas.PrefetchSent}, {NodeID: "b", State: schemas.PrefetchReady}, {NodeID: "c", State: schemas.PrefetchSkipped},
	}}
	s.note(p, 2, nil)
	if !s.Wants("a", ref) || s.Wants("b", ref) || s.Wants("c", ref) || s.Wants("a", other) || s.Wants("a", elsewhere) || s.Wants("z", ref) {
		t.Fatal("Wants does not follow the open entries")
	}
	older := p
	older.Nodes = []schemas.PrefetchNode{{NodeID: "b", State: schemas.PrefetchSent}}
	s.note(older, 1, nil)
	if !s.Wants("a", ref) || s.Wants("b", ref) {
		t.Fatal("an older revision replaced a newer one")
	}
	done := p
	done.Nodes = []schemas.PrefetchNode{{NodeID: "a", State: schemas.PrefetchPulling}, {NodeID: "b", State: schemas.PrefetchReady}}
	s.note(done, 3, nil)
	if !s.Wants("a", ref) {
		t.Fatal("a pulling entry is open")
	}
	done.Nodes[0].State = schemas.PrefetchFailed
	s.note(done, 4, nil)
	if s.Wants("a", ref) {
		t.Fatal("a failed entry still wants the image")
	}
	q := p
	q.ID = "pf-2"
	s.note(q, 5, nil)
	now = t0.Add(time.Hour)
	if s.Wants("a", ref) {
		t.Fatal("a prefetch past its deadline still wants the image")
	}
	s.prune(now)
	if _, ok := s.Get("pf-2"); ok || len(s.wanted) != 0 {
		t.Fatalf("pruned copy keeps %d wants", len(s.wanted))
	}
}

// TestDiskKeepListsOpenEntries: a node's disk collection keeps the image of
// an open prefetch entry on it, until the entry is done or its deadline.
func TestDiskKeepListsOpenEntries(t *testing.T) {
	now := t0
	s := New(nil, nil, nil, nil, 0, func() time.Time { return now }, zap.NewNop())
	image := "registry.test/team/model@" + digest
	s.note(schemas.Prefetch{ID: "pf-1", Image: image, ManifestDigest: digest, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), Nodes: []schemas.PrefetchNode{
		{NodeID: "a", State: schemas.PrefetchSent}, {NodeID: "b", State: schemas.PrefetchReady},
	}}, 1, nil)
	if got := s.DiskKeep("a"); len(got) != 1 || got[0].Kind != schemas.DiskItemImage || got[0].ID != digest || got[0].Reason == "" {
		t.Fatalf("keep for a: %+v, want the prefetched image with why", got)
	}
	if got := s.DiskKeep("b"); len(got) != 0 {
		t.Fatalf("keep for b (its entry is done): %+v", got)
	}
	now = t0.Add(time.Hour)
	if got := s.DiskKeep("a"); len(got) != 0 {
		t.Fatalf("keep for a past the deadline: %+v", got)
	}
}
