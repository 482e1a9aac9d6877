// Package nodelog owns a workload's output on its node: the log writer the
// container runtime's shim starts beside each workload (writer.go), the
// files it keeps in the workload's output directory (layout.go), and the
// node agent's way back through them: reading chunks of whole lines
// (tail.go) and remembering what JetStream has acknowledged (journal.go).
//
// The writer is a process of its own, a child of the shim, so output keeps
// reaching disk while the agent is down; the agent ships it when it comes
// back, from the offset its journal says was acknowledged.
package nodelog
