package bus

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Session residency: where a long-lived session runs, under which lease
// epoch, and the durable inbox its requests wait in. See package residency.
const (
	// StreamInbox holds work for resident sessions, one subject per session.
	StreamInbox = "WF_INBOX"
	// BucketLeases holds one session lease per `<tenant>.<session>`: holder,
	// epoch and expires_at. Liveness is the record's own expires_at, checked
	// by the reader; the bucket has no TTL and a lease is never deleted.
	BucketLeases = "wf_leases"
	// BucketResidency holds one residency observation per
	// `<tenant>.<session>`, fenced by lease epoch; release writes an
	// `expired` tombstone that keeps the epoch, never a delete.
	BucketResidency = "wf_residency"
	// BucketSessions holds each session's durable state per
	// `<tenant>.<session>`: namespace prefix, compatibility id of the
	// runtime build that wrote it, checkpoint sequence. It outlives every
	// residency; only the control plane writes it.
	BucketSessions = "wf_sessions"

	// placementKeyPrefix starts the wf_leases key of a session's placement
	// (SessionPlacementKey); no lease key has a '/'.
	placementKeyPrefix = "placements/"

	// SubjectInboxAll matches every session inbox.
	SubjectInboxAll = "wf.residency.*.*.inbox"

	subjectResidencyPrefix = "wf.residency."

	// SubjectSessionAttach asks the control plane to place a session on a
	// node and attach it there (core request/reply).
	SubjectSessionAttach = "wf.admin.session.attach"
	// SubjectSessionRelease asks the control plane to release a resident
	// session gracefully on the node that holds it.
	SubjectSessionRelease = "wf.admin.session.release"
)

// NodeSessions is where the control plane asks one node's agent to act on
// its sessions (op: attach, release, list, drain). The agent subscribes to
// its own `wf.node.<id>.sessions.*`; the control plane is its only caller.
func NodeSessions(nodeID, op string) string { return subjectNodePrefix + nodeID + ".sessions." + op }

// NodeResidencyService is where one node's agent asks the control plane's
// residency services (op: lease_acquire, route_publish, state_load, …;
// schemas.ResidencyOp); "*" for nodeID serves every node. The node id in the
// subject is the caller's identity: an agent may publish only its own
// `wf.node.<id>.>`.
func NodeResidencyService(nodeID, op string) string {
	return subjectNodePrefix + nodeID + residencyServiceInfix + op
}

const residencyServiceInfix = ".residency."

// ResidencyServiceNode is the node id in a NodeResidencyService subject; ""
// for any other subject.
func ResidencyServiceNode(subject string) string {
	rest, ok := strings.CutPrefix(subject, subjectNodePrefix)
	if !ok {
		return ""
	}
	node, op, ok := strings.Cut(rest, residencyServiceInfix)
	if !ok || node == "" || op == "" || strings.Contains(node, ".") || strings.Contains(op, ".") {
		return ""
	}
	return node
}

// SessionInbox is the subject producers publish a session's work on.
func SessionInbox(tenant, session string) string {
	return subjectResidencyPrefix + tenant + "." + session + ".inbox"
}

// ResidencyKey is a session's key in wf_leases and wf_residency.
func ResidencyKey(tenant, session string) string { return tenant + "." + session }

// InboxConsumer is the durable name of a session's inbox consumer. The
// tenant's length prefixes it so that no two (tenant, session) pairs share a
// name however their characters fall.
func InboxConsumer(tenant, session string) string {
	return "inbox-" + strconv.Itoa(len(tenant)) + "-" + tenant + "-" + session
}

// inboxStreamConfig is WF_INBOX: a work queue (a message is gone once the
// resident host acks it), deduplicated on Nats-Msg-Id.
func inboxStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamInbox,
		Description: "work for resident sessions, one durable consumer per session",
		Subjects:    []string{SubjectInboxAll},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  2 * time.Minute,
		Replicas:    replicas,
	}
}

func leasesKVConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketLeases,
		Description: "session leases: holder, epoch, expires_at; CAS only, never deleted",
		History:     5,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

func sessionsKVConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketSessions,
		Description: "session durable state: namespace, compatibility id, checkpoint sequence; CAS only",
		History:     5,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

func residencyKVConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketResidency,
		Description: "session residency observations, fenced by lease epoch; release writes a tombstone",
		History:     8,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

// InboxConsumerConfig is a session's durable inbox consumer, created by the
// control plane when it grants the session's lease. Only the lease holder
// pulls from it. MaxAckPending 1 hands the session one message at a time;
// ackWait bounds how long a message taken by a host that then vanished waits
// before it is redelivered to the next holder.
func InboxConsumerConfig(tenant, session string, ackWait time.Duration) jetstream.ConsumerConfig {
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	return jetstream.ConsumerConfig{
		Durable:       InboxConsumer(tenant, session),
		Description:   "inbox of session " + ResidencyKey(tenant, session),
		FilterSubject: SessionInbox(tenant, session),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// SessionPlacementKey is the wf_leases key of the node an operator's attach
// placed a session on (schemas.SessionPlacement): the one node that may
// acquire the session's lease while the attach runs.
func SessionPlacementKey(tenant, session string) string {
	return placementKeyPrefix + tenant + "." + session
}
