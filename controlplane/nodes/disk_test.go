package nodes

import (
	"fmt"
	"slices"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/cache"
	"github.com/warmfleet/warmfleet/schemas"
)

type keeper []schemas.DiskItem

func (k keeper) DiskKeep(string) []schemas.DiskItem { return k }

// What a node must keep is the image, caches and artifacts of every Run booked on it,
// running or queued, once each, plus what the keepers add; nothing of
// another node's Runs, of Runs not yet placed, or of ended ones.
func TestKeepForNode(t *testing.T) {
	dig := func(i int) string { return fmt.Sprintf("sha256:%064x", i+1) }
	img := func(i int) string { return "registry.example/app@" + dig(i) }
	c := cache.New()
	for i, r := range []schemas.Run{
		{ID: "running", NodeID: "n1", Phase: schemas.PhaseRunning, Request: schemas.RunRequest{Image: img(0), Caches: []schemas.CacheMount{{Name: "pip", CompatibilityKey: "py3", Path: "/p"}}}},
		{ID: "queued", NodeID: "n1", Phase: schemas.PhasePlaced, Queued: true, Request: schemas.RunRequest{Image: img(1), Caches: []schemas.CacheMount{{Name: "pip", CompatibilityKey: "py3", Path: "/p"}}}},
		{ID: "same-image", NodeID: "n1", Phase: schemas.PhasePreparing, Request: schemas.RunRequest{Image: img(0)},
			Artifacts: []schemas.ArtifactMount{{Name: "weights", Version: "v1", Digest: dig(7), SizeBytes: 10, Source: schemas.ArtifactSource{Object: "sha256/x"}, Path: "/w"}}},
		{ID: "elsewhere", NodeID: "n2", Phase: schemas.PhaseRunning, Request: schemas.RunRequest{Image: img(2)}},
		{ID: "waiting", Phase: schemas.PhaseAccepted, Request: schemas.RunRequest{Image: img(3)}},
		{ID: "done", NodeID: "n1", Phase: schemas.PhaseSucceeded, Request: schemas.RunRequest{Image: img(4)},
			Artifacts: []schemas.ArtifactMount{{Name: "old", Version: "v1", Digest: dig(8), SizeBytes: 10, Source: schemas.ArtifactSource{Object: "sha256/y"}, Path: "/w"}}},
	} {
		c.NoteRun(r, uint64(i+1), nil)
	}
	s := &Service{cache: c}
	s.AddDiskKeeper(keeper{{Kind: schemas.DiskItemImage, ID: dig(5), Reason: "prefetching"}})
	got := s.keepFor("n1")
	want := []schemas.DiskItem{
		{Kind: schemas.DiskItemArtifact, ID: dig(7), Reason: "booked by run same-image"},
		{Kind: schemas.DiskItemCache, ID: "pip/py3", Reason: "queued here for run queued"}, // two Runs need it: the first by id names it
		{Kind: schemas.DiskItemImage, ID: dig(0), Reason: "booked by run running"},
		{Kind: schemas.DiskItemImage, ID: dig(1), Reason: "queued here for run queued"},
		{Kind: schemas.DiskItemImage, ID: dig(5), Reason: "prefetching"},
	}
	if !slices.Equal(got.Items, want) {
		t.Fatalf("keep for n1:\n got %+v\nwant %+v", got.Items, want)
	}
}
