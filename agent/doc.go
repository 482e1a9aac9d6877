// Package agent is the node agent: it enrolls with the control plane over
// NATS (dialing out; it listens on nothing), reads its own command consumer,
// applies each command once through a container runtime
// (noderuntime.Runtime), keeps a durable journal of applied operations, and
// reports what it observes.
package agent
