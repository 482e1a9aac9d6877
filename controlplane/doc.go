// Package controlplane owns warmfleet's decisions: it takes Run requests off
// WF_RUNS, keeps the Run and node records in KV (changed only by CAS),
// places Runs on nodes, sends node agents their commands, ingests what they
// observe, and drives every Run to a terminal phase. Each replica keeps a
// read-only cache of the buckets fed by KV watches; several replicas can run
// at once because every write is a CAS on the stored revision.
package controlplane
