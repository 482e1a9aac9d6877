package agent

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/schemas"
)

func holdingOf(s *attempts, id string) (disk.Holding, bool) {
	for _, h := range s.Holdings() {
		if h.Attempt == id {
			return h, true
		}
	}
	return disk.Holding{}, false
}

// An attempt holds what its prepares and its launch ensured until it is
// released; a launch after a prepare of the same image finds it prepared,
// one for another image or without a prepare does not.
func TestAttempts_HoldPrepareLaunchRelease(t *testing.T) {
	s := newAttempts()
	if s.launching("a0", "", nil, nil) {
		t.Error("a launch without a digest found its image prepared")
	}
	s.prepared("a1", "sha256:img")
	s.holdArtifact("a1", "sha256:art")
	s.holdArtifact("a1", "sha256:art") // held once however often
	if !s.launching("a1", "sha256:img", []schemas.CacheMount{{Name: "pip", CompatibilityKey: "py3"}, {Name: "models"}}, []string{"GPU-1"}) {
		t.Error("a launch after its prepare did not find the image prepared")
	}
	if s.launching("a2", "sha256:img", nil, nil) {
		t.Error("another attempt's launch found an image it never prepared")
	}
	if s.launching("a3", "sha256:other", nil, nil) {
		t.Error("a launch without a prepare found its image prepared")
	}
	h, ok := holdingOf(s, "a1")
	if !ok || h.Image != "sha256:img" || !slices.Equal(h.Artifacts, []string{"sha256:art"}) || !slices.Equal(h.Caches, []string{"pip/py3", "models"}) {
		t.Fatalf("a1 holds %+v (found %v)", h, ok)
	}
	if got := s.by["a1"].cards; !slices.Equal(got, []string{"GPU-1"}) {
		t.Errorf("a1 holds cards %v", got)
	}
	if h, _ := holdingOf(s, "a3"); h.Image != "sha256:other" {
		t.Errorf("a launch without a prepare holds %+v, want its image", h)
	}
	s.release("a1")
	if _, ok := holdingOf(s, "a1"); ok {
		t.Error("a released attempt still holds something")
	}
	if s.launching("a1", "sha256:img", nil, nil) {
		t.Error("a released attempt's image still counts as prepared")
	}
}

// A failed preparation is remembered for the attempt's launch, alongside
// what it holds, and forgotten with the rest on release.
func TestAttempts_FailedPreparation(t *testing.T) {
	s := newAttempts()
	if _, ok := s.prepareFailed("a1"); ok {
		t.Fatal("a failure for an attempt never prepared")
	}
	s.prepared("a1", "sha256:img")
	s.failPrepare("a1", schemas.CodeArtifactDigestMismatch, "wrong bytes")
	f, ok := s.prepareFailed("a1")
	if !ok || f.code != schemas.CodeArtifactDigestMismatch || f.msg != "wrong bytes" {
		t.Fatalf("failure %+v %v", f, ok)
	}
	if h, _ := holdingOf(s, "a1"); h.Image != "sha256:img" {
		t.Errorf("a failed artifact let go of the prepared image: %+v", h)
	}
	s.release("a1")
	if _, ok := s.prepareFailed("a1"); ok {
		t.Error("a released attempt's failure is still remembered")
	}
}

// Prepares, launches, failures, releases and disk sweeps reading the
// holdings all at once (the race detector watches).
func TestAttempts_ConcurrentUse(t *testing.T) {
	s := newAttempts()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				id := fmt.Sprintf("a%d-%d", i, j%5)
				digest := fmt.Sprintf("sha256:%d", j%3)
				s.prepared(id, digest)
				s.holdArtifact(id, "sha256:art")
				s.launching(id, digest, []schemas.CacheMount{{Name: "c"}}, nil)
				if j%7 == 0 {
					s.failPrepare(id, schemas.CodeArtifactFetchFailed, "x")
				}
				s.prepareFailed(id)
				if j%4 == 0 {
					s.release(id)
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			for _, h := range s.Holdings() {
				if h.Attempt == "" {
					t.Error("a holding without its attempt")
				}
			}
		}
	})
	wg.Wait()
	for i := range 8 {
		for k := range 5 {
			s.release(fmt.Sprintf("a%d-%d", i, k))
		}
	}
	if n := len(s.Holdings()); n != 0 {
		t.Errorf("%d attempts held after every one was released", n)
	}
}
