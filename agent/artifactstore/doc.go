// Package artifactstore owns a node's artifact replicas: content-addressed
// files under the agent's data dir, fetched from a Source, verified by
// sha256 before anything uses them, re-verified on use, and listed for facts.
package artifactstore
