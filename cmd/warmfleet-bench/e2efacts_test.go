package main

import (
	"testing"
	"time"
)

// TestTimedRuntime_InventoryDuring: a launch counts as overlapped by a
// facts measurement when their spans intersect, not when they only touch.
func TestTimedRuntime_InventoryDuring(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rt := &timedRuntime{inventories: []span{{at(0), at(100)}, {at(500), at(520)}}}
	for _, c := range []struct {
		launch span
		want   bool
	}{
		{span{at(100), at(400)}, false}, // starts as one ends
		{span{at(150), at(500)}, false}, // ends as the next starts
		{span{at(50), at(200)}, true},
		{span{at(400), at(600)}, true},
		{span{at(505), at(510)}, true},
	} {
		if got := rt.inventoryDuring(c.launch); got != c.want {
			t.Errorf("launch %v–%v: overlapped = %v, want %v", c.launch.start.Sub(t0), c.launch.end.Sub(t0), got, c.want)
		}
	}
}
