// Package residency keeps long-lived sessions resident on at most one host at
// a time, under a fenced lease epoch.
//
// A Session (tenant id + session id) keeps state between requests. Its
// durable state (namespace prefix, the compatibility id of the runtime build
// that wrote it, checkpoint sequence) outlives any residency; its requests
// wait in a durable inbox, `wf.residency.<tenant>.<session>.inbox` on stream
// WF_INBOX, which only the resident host consumes.
//
// # Pieces
//
//   - Manager (manager.go) is the host side: Attach (attach.go) runs the
//     numbered Steps and compensates in reverse on failure; the heartbeat
//     (heartbeat.go) renews the lease and republishes the observation, and
//     surrenders when the grant is lost; release.go holds the graceful release
//     and the warm countdown; Drain (drain.go) stops admissions and releases
//     every resident session.
//   - The lifecycle of one residency is a single transition table
//     (lifecycle.go). Every phase change goes through it.
//   - One fence per grant (fence.go) is shared by the Manager, the heartbeat
//     and the inbox consumer: it says whether the grant is still held and is
//     the only path by which a residency writes its observation.
//   - Ledger (ledger.go) is the one admission ledger: it charges sessions,
//     binds each charge to the residency generation that installed it, and
//     answers Draining for the whole host.
//
// # Control plane and host
//
// Only the control plane writes KV: an agent's NATS permissions
// (bus.PermsNode in bus/auth.go, tabled in docs/security.md) hold no `$KV.>`
// and no `$JS.API.>`, only the consumer info, next and ack subjects of its
// own command and session inbox consumers. The three stores that write KV
// are therefore control-plane side implementations behind small,
// data-shaped interfaces:
//
//   - SessionLeases (implemented by KVLeases over wf_leases): acquire, renew
//     and release a lease. Arguments and results are plain values
//     (LeaseGrant), so the interface can be served over NATS request/reply
//     without change. KVLeases also creates the session's durable inbox
//     consumer when it grants a lease, as the control plane creates a node's
//     command consumer at enrollment.
//   - Locations (implemented by KVLocations over wf_residency): publish an
//     observation under its epoch and write the epoch-keeping tombstone.
//   - DurableStore (implemented by KVSessions over wf_sessions): load a
//     session's durable state and commit checkpoints, fenced by epoch.
//
// The control plane serves all three to agents over request/reply on
// wf.node.<id>.residency.<op> (package controlplane/sessions; the requests,
// replies and the records the stores keep are schemas', schemas/residency.go);
// the node id in the subject is the caller, and a request for another
// node's lease, route or checkpoint is refused (NotHolder). Remote is the
// agent's client of the same interfaces, so nothing in the Manager depends
// on KV. Package nodehost runs
// a Manager inside the node agent over the agent's own runtime and answers
// the control plane's session commands (schemas.SessionCommand) on
// wf.node.<id>.sessions.<op>. Library tests call the KV stores directly.
//
// The inbox (JetStreamInboxes) binds an existing durable consumer and only
// pulls and acks from it, which is what an agent's permissions allow.
//
// # Leases and epochs
//
// wf_leases: absent → Create with epoch 1; expired (by the record's
// expires_at) → CAS Update to epoch+1; live → held. Renew is a CAS Update at
// the grant's own revision; a conflict or an expired record means the grant is
// lost, unless the record still carries the grant's token: then the conflict
// was a write of its own whose answer was lost, and the CAS is retried at the
// revision read. Release CAS-writes an "expired now" record that keeps the
// epoch. A per-key TTL is never used: JetStream drops it on Update.
//
// wf_residency: a publish under an epoch lower than the stored one (or lower
// than the current lease's) is refused; release writes an `expired`
// tombstone that keeps the epoch high-water mark; nothing is deleted.
//
// The holder treats its grant as lost a margin before the record's expiry
// (measured from when it sent the renewal), so it has stopped consuming
// before any other host can acquire the lease.
package residency
