// Package schemas holds warmfleet's wire types: what producers, the control
// plane and node agents say to each other over NATS, and the records the
// control plane keeps in KV. Every type carries json tags; msgpack uses the
// same names (see bus/codec). Validation that refuses bad input lives beside
// the type it guards and answers with a *Refusal.
package schemas

// SchemaVersion is the version of these wire types. A message may omit its
// version field (meaning this one); a higher version is refused.
const SchemaVersion = 1
