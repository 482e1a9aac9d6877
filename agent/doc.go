// Package agent is the node agent: it enrolls with the control plane over
// NATS (dialing out; it listens on nothing), reads its own command consumer,
// applies each command once through a container runtime
// (noderuntime.Runtime), keeps a durable journal of applied operations, and
// reports what it observes. What each attempt holds is one type
// (attempts.go), a launch is one (launch.go); disk collection (agent/disk),
// output shipping (agent/output), the cache directory (agent/caches),
// credential asks (agent/creds) and artifact replicas (agent/artifactstore)
// are packages of their own.
package agent
