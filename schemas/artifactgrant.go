package schemas

import "time"

// ArtifactGrant is a one-time NATS login to read the artifact object store,
// minted for one fetch by one node's session. It is stored in
// wf_artifact_grants under ArtifactGrantKey of its token (never the token
// itself) so that the auth callout of any control-plane replica can admit
// it, once, before ExpiresAt. Consumer is the pull consumer of the
// object's chunks the control plane created for the fetch: the only one
// the login may pull.
type ArtifactGrant struct {
	NodeID       string    `json:"node_id"`
	FencingToken uint64    `json:"fencing_token"`
	Digest       string    `json:"digest"`
	Object       string    `json:"object"`
	Consumer     string    `json:"consumer"`
	RunID        string    `json:"run_id,omitempty"`
	PrefetchID   string    `json:"prefetch_id,omitempty"`
	ExpiresAt    time.Time `json:"expires_at"`
}
