// Package placement decides where a Run goes. It scores every node by the
// time the Run would take to start there — image bytes still to fetch given
// the layers the node holds, caches it would have to fill, its queue — plus
// the node's price, and records why every other node lost (invariant 4).
// It is a pure function of a fleet snapshot: the control plane keeps the
// snapshot current and does every write by CAS.
package placement
