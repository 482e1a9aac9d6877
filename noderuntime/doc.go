// Package noderuntime is the node runtime contract: the Runtime a node agent
// runs workloads through, the values that cross it (ImageSpec, WorkloadSpec,
// WorkloadStatus and their parts), the errors it returns, and the SessionHost
// a node agent may run beside its own commands. It holds no implementation:
// adapters/containerd implements Runtime in production and
// internal/noopruntime stands in for it; package agent and package residency
// consume it, and residency/nodehost implements SessionHost.
//
// # Idempotency
//
// A workload id is chosen by the caller (the agent uses one per Run
// attempt; residency one per session and lease epoch) and is the runtime's
// container id, so every operation can be repeated after a crash without
// guessing what the first try did:
//
//   - EnsureImage of an image already present (and unpacked, when asked)
//     fetches nothing and reports AlreadyPresent.
//   - Launch of an id the runtime already holds returns an error matching
//     ErrWorkloadExists and changes nothing, so a repeated launch is seen
//     as one already done, never as a second workload.
//   - Wait and Inspect change nothing; Wait works for a workload started by
//     an earlier process.
//   - Stop of a workload that has exited (or never started) is not an error;
//     Stop of an id the runtime does not hold returns an error matching
//     ErrWorkloadNotFound.
//   - Remove of an id the runtime does not hold has nothing left to do: it
//     returns nil or an error matching ErrWorkloadNotFound, and callers treat
//     both as removed.
//   - RemoveImage of an image the runtime does not hold removes nothing and
//     returns nil, so a collection cut short can run again.
//
// Absence is reported with the sentinel errors (ErrWorkloadNotFound,
// ErrImageNotFound), matched with errors.Is, so a caller can tell "gone"
// from "failed".
package noderuntime
