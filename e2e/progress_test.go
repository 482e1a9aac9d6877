package e2e

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_PullProgressVisible: an image import that takes a while is
// visible as it goes, as progress events on the Run's log whose byte counts
// only grow and end at the archive's size, and the Run drops its progress
// once the image is ready.
func TestAcceptance_PullProgressVisible(t *testing.T) {
	w := newWorld(t)
	// Random bytes do not compress, so the archive is as large as the file.
	rng := rand.New(rand.NewPCG(1, 2))
	blob := make([]byte, 48<<20)
	for i := range blob {
		blob[i] = byte(rng.Uint32())
	}
	big := testenv.BuildBusyboxImage(t, w.imageDir, "big", testenv.WithFile("/data/blob", string(blob)))
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-a", world: w, progressInterval: 5 * time.Millisecond})

	id := f.submit(schemas.RunRequest{RequestID: "progress", Image: big.Reference, Command: []string{"true"}})
	r := f.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)
	if r.Progress != nil {
		t.Fatalf("finished Run still carries progress %+v", *r.Progress)
	}

	var reports []schemas.TransferProgress
	sawPreparing := false
	for _, ev := range f.events(id) {
		switch {
		case ev.Type == schemas.EventPhase && ev.Phase == schemas.PhasePreparing:
			sawPreparing = true
		case ev.Type == schemas.EventProgress:
			if !sawPreparing || ev.Phase != schemas.PhasePreparing || ev.Progress == nil || ev.ObservedAt == nil {
				t.Fatalf("progress event %+v outside preparing or without counts", ev)
			}
			if !strings.HasPrefix(ev.Message, "image transfer ") {
				t.Fatalf("progress event message %q", ev.Message)
			}
			reports = append(reports, *ev.Progress)
		}
	}
	if len(reports) < 2 {
		t.Fatalf("%d progress events for a %d-byte import, want at least 2", len(reports), big.SizeBytes)
	}
	for i, p := range reports {
		if p.TotalBytes != big.SizeBytes || p.DoneBytes > p.TotalBytes || (i > 0 && p.DoneBytes <= reports[i-1].DoneBytes) {
			t.Fatalf("progress reports %+v: want strictly growing counts of %d bytes", reports, big.SizeBytes)
		}
	}
}
