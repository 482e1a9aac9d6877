package prefetch

import (
	"slices"

	"github.com/warmfleet/warmfleet/schemas"
)

// keyOf is what a prefetch wants on a node.
func keyOf(p schemas.Prefetch, nodeID string) wantKey {
	if p.Artifact != nil {
		return wantKey{node: nodeID, artifact: p.Artifact.Digest}
	}
	return wantKey{node: nodeID, image: imageOf(p)}
}

// imageOf is the image a prefetch pulls, by repository and digest: a
// credential is asked for a registry, so the digest alone would let a
// prefetch from one registry unlock another's.
func imageOf(p schemas.Prefetch) schemas.ImageRef {
	ref, err := schemas.ParseImageRef("image", p.Image)
	if err != nil { // validated at intake; a record that fails wants nothing
		return schemas.ImageRef{}
	}
	return ref
}

// Wants says whether a live prefetch of any tenant still waits for node
// nodeID to hold image ref (ImageTenants, which the registry credential
// service asks, says whose).
func (s *Service) Wants(nodeID string, ref schemas.ImageRef) bool {
	return len(s.ImageTenants(nodeID, ref)) > 0
}

// ImageTenants lists the tenants whose live prefetches still wait for node
// nodeID to hold image ref (as Wants), sorted: the registry credential
// service gives a prefetch's pull its tenant's credential
// (registryauth.ImageWanted).
func (s *Service) ImageTenants(nodeID string, ref schemas.ImageRef) []string {
	if ref == (schemas.ImageRef{}) {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, deadline := range s.wanted[wantKey{node: nodeID, image: ref}] {
		if now.Before(deadline) {
			out = append(out, s.records[id].p.TenantOf())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// WantsArtifact says whether a live prefetch still waits for node nodeID
// to hold the artifact of digest, as Wants does for an image. The artifact
// credential service asks it before it answers a node that has no booking
// for the artifact.
func (s *Service) WantsArtifact(nodeID, digest string) bool {
	if digest == "" {
		return false
	}
	return s.wants(wantKey{node: nodeID, artifact: digest})
}

// ArtifactWanted is WantsArtifact with the source the live prefetch names,
// the form the artifact credential service takes.
func (s *Service) ArtifactWanted(nodeID, digest string) (schemas.ArtifactSource, bool) {
	if !s.WantsArtifact(nodeID, digest) {
		return schemas.ArtifactSource{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if a := r.p.Artifact; a != nil && a.Digest == digest {
			return a.Source, true
		}
	}
	return schemas.ArtifactSource{}, false
}

func (s *Service) wants(k wantKey) bool {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, deadline := range s.wanted[k] {
		if now.Before(deadline) {
			return true
		}
	}
	return false
}

// DiskKeep lists the images and artifacts with a live prefetch on the
// node: its disk collection keeps them (nodes.DiskKeeper).
func (s *Service) DiskKeep(nodeID string) []schemas.DiskItem {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schemas.DiskItem
	for k, deadlines := range s.wanted {
		if k.node != nodeID {
			continue
		}
		for _, d := range deadlines {
			if !now.Before(d) {
				continue
			}
			item := schemas.DiskItem{Kind: schemas.DiskItemImage, ID: k.image.Digest, Reason: "an operator's prefetch wants it here"}
			if k.artifact != "" {
				item.Kind, item.ID = schemas.DiskItemArtifact, k.artifact
			}
			out = append(out, item)
			break
		}
	}
	return out
}
