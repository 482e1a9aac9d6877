package placement

import (
	"testing"
	"time"
)

// TestCanStartPassesOverFetching: a queued booking still fetching its
// bytes does not head the queue; the first one whose bytes are there
// does, and starts only beside what the fetches ahead of it will claim.
func TestCanStartPassesOverFetching(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	node := func(queued ...Booking) *Node {
		n := gpuNode("n", "NVIDIA H100 80GB HBM3", 80<<30, 0, now)
		n.Queued = queued
		return n
	}
	gpus := func(id string, count int64, fetching bool) Booking {
		b := Booking{RunID: id, Fetching: fetching}
		b.Resources.GPUCount, b.Resources.CPUMillis = count, 1000*count
		return b
	}
	for _, c := range []struct {
		name string
		n    *Node
		run  string
		want bool
	}{
		{"a fetch heads nothing", node(gpus("f", 4, true)), "f", false},
		{"ready behind a fetch, room for both", node(gpus("f", 4, true), gpus("r", 4, false)), "r", true},
		{"ready behind a fetch, no room beside it", node(gpus("f", 6, true), gpus("r", 4, false)), "r", false},
		{"ready ahead of a fetch", node(gpus("r", 6, false), gpus("f", 4, true)), "r", true},
		{"second ready waits for the first", node(gpus("a", 1, false), gpus("b", 1, false)), "b", false},
	} {
		if got := c.n.CanStart(c.run); got != c.want {
			t.Errorf("%s: CanStart(%s) = %v, want %v", c.name, c.run, got, c.want)
		}
	}
}
