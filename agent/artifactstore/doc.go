// Package artifactstore owns a node's artifact replicas: content-addressed
// files under the agent's data dir, fetched from a Source, verified by
// sha256 before anything uses them, re-verified on use, and listed for facts.
//
// The rules:
//   - A replica is named by its digest and is only ever the bytes that hash
//     to it: fetched bytes that do not match are deleted, never moved into
//     blobs/, and every Ensure re-hashes a replica before handing it out.
//   - Ensure is idempotent: a verified replica is answered as present; a
//     missing or corrupt one is fetched.
//   - A fetch resumes: an interrupted one (cancelled, failed, or the process
//     gone) leaves its partial file, and the next attempt continues from its
//     end unless the source cannot (ErrNoResume), then from 0.
//   - One digest, one fetch: concurrent Ensures of a digest in this process
//     share it; each waiter may leave on its own context, and the fetch
//     stops only when the last one has.
//   - The store removes only when asked, and never a replica a workload
//     holds (Hold) or one being fetched; what to collect is the agent's
//     decision.
package artifactstore
