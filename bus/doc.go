// Package bus owns warmfleet's use of NATS: the embedded server, connecting,
// the names of subjects, streams, consumers and KV buckets, and creating them
// idempotently. Nothing here knows what a Run is; wire types live in schemas
// and their encoding in bus/codec.
package bus
