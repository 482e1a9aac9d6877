package bus

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names.
const (
	StreamEvents = "WF_EVENTS"
	StreamCmds   = "WF_CMDS"
	StreamObs    = "WF_OBS"
)

// KV bucket names.
const (
	BucketNodes   = "wf_nodes"
	BucketRuns    = "wf_runs"
	BucketEnroll  = "wf_enroll"
	BucketRentals = "wf_rentals"
	// BucketPrefetch holds operators' prefetches by id.
	BucketPrefetch = "wf_prefetch"
	// BucketArtifacts is the artifact catalog: schemas.ArtifactRecord by
	// schemas.ArtifactKey(name, version).
	BucketArtifacts = "wf_artifacts"
	// ObjectBucketArtifacts is the object store bucket holding artifact
	// content put through the control plane (the embedded default source).
	ObjectBucketArtifacts = "wf_artifact_content"
	// ObjectBucketCheckpoints holds sessions' workspace checkpoints
	// (residency/checkpoint), written and read only by the control plane
	// for the node that holds a session's lease.
	ObjectBucketCheckpoints = "wf_checkpoints"
	// BucketArtifactGrants holds one-time artifact logins
	// (schemas.ArtifactGrant) by the SHA-256 of their token.
	BucketArtifactGrants = "wf_artifact_grants"
)

// ArtifactGrantsMaxAge is how long wf_artifact_grants keeps a grant nobody
// used; each grant's own expires_at, checked at login, is shorter.
const ArtifactGrantsMaxAge = time.Hour

// RunPurgeMarkerTTL is how long the marker left by purging an ended Run
// from wf_runs stays: long enough for every replica's watch to see it.
const RunPurgeMarkerTTL = time.Hour

// DefaultEventsMaxAge is how long WF_EVENTS keeps a Run event: twice the
// default Run retention, so a Run's history outlives its record and the
// retention finds its outbox's events still stored when it removes it.
const DefaultEventsMaxAge = 14 * 24 * time.Hour

// PrefetchMaxAge is how long a prefetch record outlives its last change.
const PrefetchMaxAge = 7 * 24 * time.Hour

// Durable consumer names owned by the control plane. Several control-plane
// replicas share each one, so a message is handled by one replica.
const (
	ConsumerIntake = "cp-intake"
	ConsumerObs    = "cp-obs"
)

// MaxNodeConsumers is WF_CMDS's consumer limit: how many nodes can be
// enrolled at once. Provision applies it to an existing stream too.
const MaxNodeConsumers = 1_000_000

// DedupeWindow is how long JetStream remembers a Nats-Msg-Id. A submit
// repeated after it is still one Run: the Run id is derived from the request
// id and created with KV Create.
const DedupeWindow = 10 * time.Minute

// Topology says how the streams and buckets are laid out.
type Topology struct {
	// Replicas for every stream and bucket: 1 on a single server, 3 on a
	// JetStream cluster.
	Replicas int
	// EventsMaxAge bounds the audit log; DefaultEventsMaxAge when 0.
	// Provision applies it to an existing stream too.
	EventsMaxAge time.Duration
	// LogsMaxAge and LogsMaxBytes bound WF_LOGS; 0 is DefaultLogsMaxAge,
	// DefaultLogsMaxBytes.
	LogsMaxAge   time.Duration
	LogsMaxBytes int64
	// LogsMaxChunksPerRun caps each Run's (and session's) subject in
	// WF_LOGS; 0 is DefaultLogsMaxChunksPerRun.
	LogsMaxChunksPerRun int64
	// RunsPurgeMarkerTTL is how long the marker of a Run purged from
	// wf_runs stays; RunPurgeMarkerTTL when 0. The bucket's LimitMarkerTTL
	// is set to it: the server raises any shorter marker TTL to that.
	RunsPurgeMarkerTTL time.Duration
	// Tenants each get an intake stream (RunsStream); none is
	// schemas.DefaultTenant's alone.
	Tenants []string
}

// IntakeTenants is Tenants, or the default tenant alone when none is set.
func (t Topology) IntakeTenants() []string {
	if len(t.Tenants) == 0 {
		return []string{defaultTenant}
	}
	return t.Tenants
}

// defaultTenant is schemas.DefaultTenant, which bus cannot import.
const defaultTenant = "default"

// RunsMarkerTTL is RunsPurgeMarkerTTL or its default.
func (t Topology) RunsMarkerTTL() time.Duration {
	return cmp.Or(t.RunsPurgeMarkerTTL, RunPurgeMarkerTTL)
}

// StreamConfigs returns the stream definitions.
func (t Topology) StreamConfigs() []jetstream.StreamConfig {
	r := max(t.Replicas, 1)
	cfgs := make([]jetstream.StreamConfig, 0, 8)
	for _, tenant := range t.IntakeTenants() {
		cfgs = append(cfgs, runsStreamConfig(tenant, r))
	}
	return append(cfgs, []jetstream.StreamConfig{
		{
			Name:        StreamEvents,
			Description: "Run events: the audit log of every decision and phase change",
			Subjects:    []string{SubjectEvents},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			MaxAge:      cmp.Or(t.EventsMaxAge, DefaultEventsMaxAge),
			// The server refuses a dedupe window longer than the max age.
			Duplicates: min(2*time.Minute, cmp.Or(t.EventsMaxAge, DefaultEventsMaxAge)),
			// A Run's last event is read for each outbox repair and each
			// Run the retention removes: direct gets spare the JS API.
			AllowDirect: true,
			Replicas:    r,
		},
		{
			Name:        StreamCmds,
			Description: "Commands from the control plane to node agents, one durable consumer per node",
			Subjects:    []string{SubjectNodeCmdAll},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Duplicates:  DedupeWindow,
			Replicas:    r,
			// One consumer per enrolled node. An unlimited (0 or -1)
			// setting does not lift nats-server's default of 1,000
			// consumers per stream; only a positive limit does.
			MaxConsumers: MaxNodeConsumers,
		},
		{
			Name:        StreamObs,
			Description: "Observations from node agents to the control plane",
			Subjects:    []string{SubjectNodeObsAll},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Duplicates:  2 * time.Minute,
			Replicas:    r,
		},
		inboxStreamConfig(r),
		t.logsStreamConfig(r),
		usageStreamConfig(r),
	}...)
}

// KVConfigs returns the bucket definitions.
func (t Topology) KVConfigs() []jetstream.KeyValueConfig {
	r := max(t.Replicas, 1)
	return []jetstream.KeyValueConfig{
		{Bucket: BucketNodes, Description: "fenced node registry", History: 5, Storage: jetstream.FileStorage, Replicas: r},
		// An ended Run is purged once past its retention, with a purge
		// marker that carries a TTL (RunPurgeMarkerTTL) so the bucket does
		// not keep a tombstone per Run forever; LimitMarkerTTL enables
		// per-message TTLs on the bucket.
		{Bucket: BucketRuns, Description: "Runs by id; every phase change is a CAS update; ended Runs are purged after their retention", History: 5,
			Storage: jetstream.FileStorage, Replicas: r, LimitMarkerTTL: t.RunsMarkerTTL()},
		{Bucket: BucketRentals, Description: "rented machines by rental id; every change is a CAS update", History: 5, Storage: jetstream.FileStorage, Replicas: r},
		// Invitations carry their own expires_at, checked on redemption; the
		// bucket's TTL only sweeps ones never redeemed.
		{Bucket: BucketEnroll, Description: "single-use node invitations by token hash", History: 1, Storage: jetstream.FileStorage, Replicas: r, TTL: 8 * 24 * time.Hour},
		// A prefetch's own expires_at ends its live entries; the bucket's
		// TTL, renewed by every update, removes records nobody reads.
		{Bucket: BucketPrefetch, Description: "operators' prefetches by id; every change is a CAS update", History: 1, Storage: jetstream.FileStorage, Replicas: r, TTL: PrefetchMaxAge},
		{Bucket: BucketArtifacts, Description: "artifact catalog by name/version; changed only by CAS", History: 5, Storage: jetstream.FileStorage, Replicas: r},
		// A grant is written once and deleted at its login; the TTL sweeps
		// the ones never used.
		{Bucket: BucketArtifactGrants, Description: "one-time artifact logins by token hash", History: 1, Storage: jetstream.FileStorage, Replicas: r, TTL: ArtifactGrantsMaxAge},
		// Sealed secrets: one value each (a re-sealed or removed value
		// leaves no older seal behind), never expiring.
		{Bucket: BucketSecrets, Description: "tenants' secrets, sealed, by <tenant>.<name>; changed only by CAS", History: 1, Storage: jetstream.FileStorage, Replicas: r},
		leasesKVConfig(r),
		residencyKVConfig(r),
		sessionsKVConfig(r),
	}
}

// Provision creates or updates every stream and bucket. It is idempotent
// and keeps existing data.
func Provision(ctx context.Context, js jetstream.JetStream, t Topology) error {
	for _, cfg := range t.StreamConfigs() {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("bus: provision stream %s: %w", cfg.Name, err)
		}
	}
	for _, cfg := range t.KVConfigs() {
		if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
			return fmt.Errorf("bus: provision bucket %s: %w", cfg.Bucket, err)
		}
	}
	for _, cfg := range t.ObjectStoreConfigs() {
		if _, err := js.CreateOrUpdateObjectStore(ctx, cfg); err != nil {
			return fmt.Errorf("bus: provision object store %s: %w", cfg.Bucket, err)
		}
	}
	return nil
}

// ObjectStoreConfigs returns the object store definitions.
func (t Topology) ObjectStoreConfigs() []jetstream.ObjectStoreConfig {
	return []jetstream.ObjectStoreConfig{
		{Bucket: ObjectBucketArtifacts, Description: "artifact content; each object verified by its SHA-256 digest", Storage: jetstream.FileStorage, Replicas: max(t.Replicas, 1)},
		{Bucket: ObjectBucketCheckpoints, Description: "sessions' workspace checkpoints: chunks by digest, records by sequence, under <tenant>/<session>/", Storage: jetstream.FileStorage, Replicas: max(t.Replicas, 1)},
	}
}

// IntakeConsumerConfig is the control plane's shared consumer on each
// tenant's intake stream (RunsStream).
// Refused input is acked (Term), so redelivery only retries transient
// failures (KV or stream unavailable); BackOff spaces those out, and
// MaxDeliver is unlimited because a submit is never to be dropped.
func IntakeConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerIntake,
		Description:   "control-plane intake of submits and cancels",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		BackOff:       []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second},
		MaxAckPending: 1024,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// ObsConsumerConfig is the control plane's shared consumer on WF_OBS.
func ObsConsumerConfig() jetstream.ConsumerConfig {
	c := IntakeConsumerConfig()
	c.Durable = ConsumerObs
	c.Description = "control-plane ingest of node observations"
	return c
}

// NodeConsumerConfig is the durable consumer a node's agent reads commands
// from. It is created by the control plane at enrollment: agents hold no
// JetStream API rights beyond reading it. AckWait covers a command's whole
// effect (an image pull sends InProgress to extend it) and is how long a
// command taken by an agent that then crashed waits before redelivery.
func NodeConsumerConfig(nodeID string, ackWait time.Duration) jetstream.ConsumerConfig {
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	return jetstream.ConsumerConfig{
		Durable:       NodeConsumer(nodeID),
		Description:   "commands for node " + nodeID,
		FilterSubject: NodeCmd(nodeID),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 256,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}
