package disk

import (
	"slices"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestPlanWatermarks(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(h int) time.Time { return t0.Add(time.Duration(h) * time.Hour) }
	img := func(id string, size int64, used time.Time) schemas.DiskItem {
		return schemas.DiskItem{Kind: schemas.DiskItemImage, ID: id, SizeBytes: size, LastUsedAt: used}
	}
	cache := func(id string, size int64, used time.Time) schemas.DiskItem {
		return schemas.DiskItem{Kind: schemas.DiskItemCache, ID: id, SizeBytes: size, LastUsedAt: used}
	}
	disk := func(usedPct int64) schemas.DiskFacts {
		return schemas.DiskFacts{Known: true, TotalBytes: 1000, FreeBytes: 1000 - usedPct*10}
	}
	w := schemas.DiskWatermarks{High: 80, Low: 50}
	for _, tc := range []struct {
		name      string
		snap      snapshot
		wantEvict []string // ids, in order
		wantOrder []string
		wantKept  map[string]string // id → reason
	}{
		{
			name:      "below the high watermark nothing goes",
			snap:      snapshot{Disk: disk(80), Items: []schemas.DiskItem{img("a", 300, at(1))}},
			wantEvict: nil, wantOrder: []string{"a"},
		},
		{
			name: "least recently used first, images and caches alike, until at the low watermark",
			snap: snapshot{Disk: disk(90), Items: []schemas.DiskItem{
				img("new", 100, at(5)), cache("mid", 200, at(3)), img("old", 150, at(1)), cache("oldest", 50, at(0)), img("x", 10, at(4)),
			}},
			// 900 used: -50 → 850, -150 → 700, -200 → 500 (50%): stop.
			wantEvict: []string{"oldest", "old", "mid"},
			wantOrder: []string{"oldest", "old", "mid", "x", "new"},
		},
		{
			name: "busy and kept items are never chosen, whatever their age",
			snap: snapshot{Disk: disk(95), Items: []schemas.DiskItem{
				img("running", 500, at(0)), cache("mounted", 300, at(0)), img("booked", 100, at(1)), img("free", 100, at(2)),
			}, Busy: map[string]string{itemKey(schemas.DiskItemImage, "running"): "used by workload w1", itemKey(schemas.DiskItemCache, "mounted"): "mounted by workload w1"},
				Keep: map[string]string{itemKey(schemas.DiskItemImage, "booked"): "booked by run r1"}},
			wantEvict: []string{"free"},
			wantOrder: []string{"free"},
			wantKept:  map[string]string{"running": "used by workload w1", "mounted": "mounted by workload w1", "booked": "booked by run r1"},
		},
		{
			name: "never used goes before anything used; ties go larger first",
			snap: snapshot{Disk: disk(85), Items: []schemas.DiskItem{
				img("used", 400, at(1)), img("small-never", 100, time.Time{}), img("big-never", 300, time.Time{}),
			}},
			// 850: -300 → 550, -100 → 450.
			wantEvict: []string{"big-never", "small-never"},
			wantOrder: []string{"big-never", "small-never", "used"},
		},
		{
			name:      "unknown disk: nothing goes",
			snap:      snapshot{Disk: schemas.DiskFacts{}, Items: []schemas.DiskItem{img("a", 1, at(1))}},
			wantOrder: []string{"a"},
		},
		{
			name:      "everything removable is not enough: all of it goes",
			snap:      snapshot{Disk: disk(99), Items: []schemas.DiskItem{img("a", 10, at(1)), cache("b", 10, at(2))}},
			wantEvict: []string{"a", "b"}, wantOrder: []string{"a", "b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planWatermarks(tc.snap, w)
			if got := ids(p.Order[:p.Evict]); !slices.Equal(got, tc.wantEvict) {
				t.Errorf("evict %v, want %v", got, tc.wantEvict)
			}
			if got := ids(p.Order); !slices.Equal(got, tc.wantOrder) {
				t.Errorf("order %v, want %v", got, tc.wantOrder)
			}
			kept := map[string]string{}
			for _, it := range p.Kept {
				kept[it.ID] = it.Reason
			}
			if len(kept) != len(tc.wantKept) {
				t.Errorf("kept %v, want %v", kept, tc.wantKept)
			}
			for id, why := range tc.wantKept {
				if kept[id] != why {
					t.Errorf("kept %s because %q, want %q", id, kept[id], why)
				}
			}
			for _, it := range p.Order {
				if it.Reason == "" {
					t.Errorf("%s has no reason", it.ID)
				}
			}
		})
	}
}

func TestPlanPruneTakesEverythingRemovable(t *testing.T) {
	snap := snapshot{
		Disk: schemas.DiskFacts{Known: true, TotalBytes: 1000, FreeBytes: 990}, // far below any watermark
		Items: []schemas.DiskItem{
			{Kind: schemas.DiskItemImage, ID: "a", SizeBytes: 5},
			{Kind: schemas.DiskItemImage, ID: "b", SizeBytes: 5},
			{Kind: schemas.DiskItemCache, ID: "c", SizeBytes: 5},
		},
		Keep: keepSet(schemas.DiskKeep{Items: []schemas.DiskItem{{Kind: schemas.DiskItemImage, ID: "b"}}}),
	}
	p := planPrune(snap)
	if got := ids(p.Order[:p.Evict]); !slices.Equal(got, []string{"c", "a"}) { // equal ages and sizes: by kind, then id
		t.Fatalf("prune removes %v, want [c a]", got)
	}
	if len(p.Kept) != 1 || p.Kept[0].ID != "b" || p.Kept[0].Reason != "kept by the control plane" {
		t.Fatalf("kept %+v, want b kept by the control plane", p.Kept)
	}
}

func TestWatermarksValidate(t *testing.T) {
	for _, tc := range []struct {
		w  schemas.DiskWatermarks
		ok bool
	}{
		{schemas.DiskWatermarks{High: 85, Low: 70}, true},
		{schemas.DiskWatermarks{High: 99, Low: 1}, true},
		{schemas.DiskWatermarks{High: 70, Low: 70}, false},
		{schemas.DiskWatermarks{High: 70, Low: 85}, false},
		{schemas.DiskWatermarks{High: 100, Low: 50}, false},
		{schemas.DiskWatermarks{High: 50, Low: 0}, false},
	} {
		if err := tc.w.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err %v, want ok %v", tc.w, err, tc.ok)
		}
	}
}

func ids(items []schemas.DiskItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}
