package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_LaunchAfterImageRemoved: a launch trusts its attempt's
// prepare instead of ensuring the image again, so an image removed by hand
// between the two (the attempt's hold keeps disk sweeps off it, not an
// operator) must be noticed by the launch and ensured again: the Run
// starts, and the image is imported twice.
func TestAcceptance_LaunchAfterImageRemoved(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	client, err := ctrd.New(w.ctrd.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ctx := namespaces.WithNamespace(context.Background(), w.ctrd.Namespace)
	var removed atomic.Int32
	hookErr := make(chan error, 1)
	// Consulted after the prepare's effect, before the launch is applied:
	// the attempt's commands are applied in order.
	faults := &agent.Faults{LeaveUnacked: func(c schemas.Command) bool {
		if c.Kind != schemas.CmdPrepareImage || c.PrepareImage.RunID == "" || removed.Load() > 0 {
			return false
		}
		is := client.ImageService()
		recs, err := is.List(ctx, "target.digest=="+w.image.ManifestDigest)
		for _, r := range recs {
			if err == nil {
				err = is.Delete(ctx, r.Name, images.SynchronousDelete())
			}
		}
		if err != nil {
			hookErr <- err
		}
		removed.Add(int32(len(recs)))
		return false
	}}
	c := &counts{}
	f.startAgent(agentSpec{id: "n1", world: w, counts: c, faults: faults})
	id := f.submit(schemas.RunRequest{RequestID: "image-removed", Image: w.image.Reference, Command: []string{"true"}})
	f.waitPhase(id, schemas.PhaseSucceeded, 90*time.Second)
	select {
	case err := <-hookErr:
		t.Fatalf("removing the prepared image: %v", err)
	default:
	}
	if removed.Load() == 0 {
		t.Fatal("no image record was removed after the prepare; the test did not test anything")
	}
	if got := c.pulled(); got != 2 {
		t.Fatalf("image brought in %d times, want 2 (the prepare, then the launch after the removal)", got)
	}
}
