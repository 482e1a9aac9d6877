package lane

import (
	"math"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestBeats: the lane takes a Run only when it starts it sooner, by the
// margin, than the best node and than a rental.
func TestBeats(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name         string
		rental       time.Duration
		ready, start float64
		want         bool
	}{
		{"no node, no rentals", 0, 2, inf, true},
		{"a node starts it at once", 0, 2, 0, false},
		{"a node pulling a big image", 0, 2, 120, true},
		{"within the margin of the node", 0, 2, 6, false},
		{"a rental is sooner", 30 * time.Second, 60, inf, false},
		{"sooner than the rental", 3 * time.Minute, 20, inf, true},
	} {
		m := &Manager{cfg: Config{RentalReady: c.rental}}
		m.cfg.defaults()
		if got := m.beats(c.ready, c.start); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLaneIneligible: a Run goes to the lane only when it allows it and
// needs nothing a node provides.
func TestLaneIneligible(t *testing.T) {
	for _, c := range []struct {
		name string
		req  schemas.RunRequest
		ok   bool
	}{
		{"allowed", schemas.RunRequest{Ephemeral: true}, true},
		{"not allowed", schemas.RunRequest{}, false},
		{"secrets", schemas.RunRequest{Ephemeral: true, SecretEnv: []schemas.SecretEnvRef{{Name: "K", Secret: "s"}}}, false},
		{"caches", schemas.RunRequest{Ephemeral: true, Caches: []schemas.CacheMount{{Name: "c", Path: "/c"}}}, false},
		{"host network", schemas.RunRequest{Ephemeral: true, Network: "host"}, false},
	} {
		if why := c.req.LaneIneligible(); (why == "") != c.ok {
			t.Errorf("%s: %q", c.name, why)
		}
	}
}
