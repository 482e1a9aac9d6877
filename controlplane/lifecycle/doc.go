// Package lifecycle is the Run state machine: the one table of legal phase
// moves and every transition over it, each a pure function from a stored
// Run and one input to the Run after it and the events that describe the
// change. It reads no clock and touches no NATS; the caller stamps times,
// numbers the events and writes the result by CAS (controlplane/runs).
package lifecycle
