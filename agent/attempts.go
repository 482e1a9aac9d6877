package agent

import (
	"slices"
	"sync"

	"github.com/warmfleet/warmfleet/agent/disk"
	"github.com/warmfleet/warmfleet/schemas"
)

// attempts is what each attempt on this node holds, from its first prepare
// or launch until its workload is removed or its launch fails: its image,
// artifacts, caches and cards, and why its preparation failed when it did.
// Disk collection keeps what an attempt holds (Holdings); the workload's
// labels keep the same across agent restarts. Safe for concurrent use.
type attempts struct {
	mu sync.Mutex
	by map[string]*attempt
}

// attempt is one attempt's holdings.
type attempt struct {
	image     string   // manifest digest its prepare or launch ensured
	artifacts []string // sha256 digests
	caches    []string // schemas.CacheItemID
	cards     []string // GPU UUIDs its launch was given
	// failed is set when a preparation failed for a reason its launch
	// would meet again (wrong bytes, a refused credential).
	failed *prepFailure
}

// prepFailure is why an attempt's preparation failed: the code and
// message its launch fails with.
type prepFailure struct {
	code schemas.Code
	msg  string
}

func newAttempts() *attempts { return &attempts{by: map[string]*attempt{}} }

// get returns id's record, creating it; the caller holds mu.
func (s *attempts) get(id string) *attempt {
	at := s.by[id]
	if at == nil {
		at = &attempt{}
		s.by[id] = at
	}
	return at
}

// prepared records the image an attempt's prepare ensured.
func (s *attempts) prepared(id, digest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if digest != "" {
		s.get(id).image = digest
	}
}

// holdArtifact records an artifact replica the attempt prepared or mounts.
func (s *attempts) holdArtifact(id, digest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.get(id)
	if !slices.Contains(at.artifacts, digest) {
		at.artifacts = append(at.artifacts, digest)
	}
}

// launching records what a launch holds (its image, caches and cards) and
// says whether the attempt already held that image, ensured by its prepare:
// then the launch need not ensure it again.
func (s *attempts) launching(id, digest string, caches []schemas.CacheMount, cards []string) (prepared bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.get(id)
	prepared = digest != "" && at.image == digest
	if digest != "" {
		at.image = digest
	}
	for _, c := range caches {
		at.caches = append(at.caches, schemas.CacheItemID(c.Name, c.CompatibilityKey))
	}
	at.cards = append(at.cards, cards...)
	return prepared
}

// failPrepare records that an attempt's preparation failed, and why.
func (s *attempts) failPrepare(id string, code schemas.Code, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.get(id).failed = &prepFailure{code: code, msg: msg}
}

// prepareFailed returns why the attempt's preparation failed, if it did.
func (s *attempts) prepareFailed(id string) (prepFailure, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at := s.by[id]; at != nil && at.failed != nil {
		return *at.failed, true
	}
	return prepFailure{}, false
}

// release forgets the attempt: its workload is removed, or it never
// launched.
func (s *attempts) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by, id)
}

// Holdings implements disk.Busy: what every attempt holds on disk now.
func (s *attempts) Holdings() []disk.Holding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]disk.Holding, 0, len(s.by))
	for id, at := range s.by {
		out = append(out, disk.Holding{Attempt: id, Image: at.image,
			Caches: slices.Clone(at.caches), Artifacts: slices.Clone(at.artifacts)})
	}
	return out
}
