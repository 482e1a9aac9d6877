// Package e2e holds warmfleet's acceptance tests: an embedded NATS server, a
// real containerd, the control plane and node agents in one process, driven
// the way a producer or operator drives them — by publishing on subjects.
package e2e
