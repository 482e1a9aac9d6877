package controlplane

import (
	"fmt"
	"time"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/admission"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/controlplane/lane"
	"github.com/warmfleet/warmfleet/controlplane/lifecycle"
	"github.com/warmfleet/warmfleet/controlplane/nodecreds"
	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/registryauth"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/internal/metrics"
)

// Config tunes the control plane. Zero values take the defaults.
type Config struct {
	// HeartbeatInterval is what nodes are told to heartbeat at; a node's
	// lease is LeaseMultiplier heartbeats long.
	HeartbeatInterval time.Duration
	LeaseMultiplier   int
	// SessionTTL is how long an enrollment's session token is good for.
	SessionTTL time.Duration
	// ReconcileInterval is how often stuck Runs and lapsed leases are swept.
	ReconcileInterval time.Duration
	// RedispatchAfter is how long a Run may sit in placed/preparing/launching
	// without progress before its commands are sent again (same operation
	// ids, so a node applies them once).
	RedispatchAfter time.Duration
	// MaxAttempts is how many nodes a Run may be lost on before it fails.
	MaxAttempts int
	// MaxRuntimeSlack is how long past its max runtime a Run may report
	// running before the control plane itself sends a stop; the node enforces
	// the limit first.
	MaxRuntimeSlack time.Duration
	// CommandAckWait is how long a node's command waits for an ack before
	// JetStream redelivers it (to the agent's next process after a crash).
	CommandAckWait time.Duration
	// Placement weighs time against price; zero fields take defaults.
	Placement placement.Config
	// DecisionCandidates bounds the full candidate entries a stored
	// decision keeps (schemas.BookingDecision.Compact); the other nodes
	// are named by reason only. DefaultDecisionCandidates when zero.
	DecisionCandidates int
	// WaitForCapacity keeps a Run that no enrolled node could ever run
	// waiting (for a node to join) instead of failing it at once.
	WaitForCapacity bool
	// Capacity, when set, rents machines for Runs no node fits.
	Capacity *rentals.Config
	// Lane, when set, runs Runs that allow it as one-shot executions on
	// a provider's serverless product, when that starts them sooner.
	Lane *lane.Config
	// OpenEnrollment admits nodes that present no enrollment token. For
	// local development only: anyone who can publish wf.enroll joins.
	OpenEnrollment bool
	// ControlPlaneCA is the NATS server's CA certificate (PEM, public),
	// carried by every node bootstrap so agents dial TLS and trust it.
	ControlPlaneCA string
	Topology       bus.Topology
	// PrefetchFlushInterval is how often nodes' prefetch progress is written
	// to wf_prefetch; prefetch.DefaultFlushInterval when zero.
	PrefetchFlushInterval time.Duration
	// Sessions tunes session residency (controlplane/sessions).
	Sessions sessions.Config
	// Tenants are the tenants this control plane serves, sorted, always
	// with schemas.DefaultTenant (New sees to both: checkTenants); each
	// has its own intake stream (bus.RunsStream).
	Tenants []string
	// SecretsKeyFile is the key file tenants' secrets are sealed with
	// (controlplane/secrets; serve's --secrets-key-file); it must exist.
	// Empty serves no secrets: no secret service answers and Secrets is
	// nil.
	SecretsKeyFile string
	// SchedulingPolicyFile is the scheduling policy (priority classes,
	// tenants' quotas, weights, budgets and default retry; serve's
	// --scheduling-policy-file), read again when it changes; New refuses
	// one that does not load. Empty: the empty policy.
	SchedulingPolicyFile string
	// RegistryAuth holds the registry credentials nodes are given at pull
	// time (controlplane/registryauth); nil pulls every image anonymously.
	RegistryAuth *registryauth.Source
	// ArtifactSourceAuth holds the headers nodes are given to fetch
	// URL-sourced artifacts (controlplane/artifactauth); nil fetches every
	// URL anonymously.
	ArtifactSourceAuth *artifactauth.URLSource
	// ArtifactGrantTTL bounds a node's one-time login to read the artifact
	// object store; artifactauth.DefaultGrantTTL when zero.
	ArtifactGrantTTL time.Duration
	// CredentialLimit bounds each node's registry and artifact credential
	// and secret requests, per service; nodecreds.DefaultLimit when zero.
	CredentialLimit nodecreds.Limit
	// Auth, when set, serves the NATS auth callout (controlplane/admission):
	// the server asks it about every login but the control plane's own, so
	// the control plane's connection must be the auth_callout's service
	// user. Nil: the server admits logins itself.
	Auth *admission.Config
	// RunRetention is how long an ended Run stays in wf_runs after it
	// ended (runs.Retention); DefaultRunRetention when 0, and refused when
	// negative. WF_EVENTS keeps events twice as long unless
	// Topology.EventsMaxAge says otherwise, which must then be longer.
	RunRetention time.Duration
	// RetentionInterval is the time between retention sweeps; a quarter of
	// RunRetention, at most a minute, when 0.
	RetentionInterval time.Duration
	// Now is the control plane's clock; tests may replace it.
	Now func() time.Time
}

// DefaultRunRetention is how long an ended Run stays in wf_runs.
const DefaultRunRetention = 7 * 24 * time.Hour

// checkRetention refuses a retention that would keep nothing, or Run
// events kept no longer than the Runs: the retention removes a Run only
// once WF_EVENTS holds its last events, and a Run's history should outlive
// its record.
func (c *Config) checkRetention() error {
	if c.RunRetention < 0 {
		return fmt.Errorf("controlplane: run retention %s: pass a positive duration such as 168h", c.RunRetention)
	}
	if c.RunRetention == 0 {
		c.RunRetention = DefaultRunRetention
	}
	if c.Topology.EventsMaxAge == 0 {
		c.Topology.EventsMaxAge = 2 * c.RunRetention
	}
	if c.Topology.EventsMaxAge <= c.RunRetention {
		return fmt.Errorf("controlplane: events max age %s is not longer than the run retention %s: WF_EVENTS must keep a Run's events past its removal; raise the events max age or lower the retention",
			c.Topology.EventsMaxAge, c.RunRetention)
	}
	return nil
}

func (c *Config) defaults() {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	if c.LeaseMultiplier <= 0 {
		c.LeaseMultiplier = 5
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = time.Hour
	}
	if c.DecisionCandidates <= 0 {
		c.DecisionCandidates = DefaultDecisionCandidates
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = time.Second
	}
	if c.RedispatchAfter <= 0 {
		c.RedispatchAfter = 30 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.MaxRuntimeSlack <= 0 {
		c.MaxRuntimeSlack = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Auth != nil && c.Auth.Now == nil {
		a := *c.Auth
		a.Now = c.Now
		c.Auth = &a
	}
	if c.Capacity != nil {
		c.Capacity.Defaults()
	}
	def := placement.DefaultConfig()
	p := &c.Placement
	if p.PullBytesPerSecond <= 0 {
		p.PullBytesPerSecond = def.PullBytesPerSecond
	}
	if p.CacheBytesPerSecond <= 0 {
		p.CacheBytesPerSecond = def.CacheBytesPerSecond
	}
	if p.ArtifactBytesPerSecond <= 0 {
		p.ArtifactBytesPerSecond = def.ArtifactBytesPerSecond
	}
	if p.UnknownImageBytes <= 0 {
		p.UnknownImageBytes = def.UnknownImageBytes
	}
	if p.UnknownRuntime <= 0 {
		p.UnknownRuntime = def.UnknownRuntime
	}
	if p.SecondsPerDollarHour <= 0 {
		p.SecondsPerDollarHour = def.SecondsPerDollarHour
	}
	if p.FactsMaxAge <= 0 {
		p.FactsMaxAge = def.FactsMaxAge
	}
	if p.WholeNodeSeconds == 0 {
		p.WholeNodeSeconds = def.WholeNodeSeconds
	}
	if p.FailedNodePenaltySeconds == 0 {
		p.FailedNodePenaltySeconds = def.FailedNodePenaltySeconds
	}
}

// Metrics is a snapshot of the control plane's counters and of its cached
// Runs by phase.
type Metrics = metrics.ControlPlane

// DefaultDecisionCandidates keeps a decision over any fleet to about 100 KB
// (a full decision over 10,000 nodes is about 2 MB, past NATS's 1 MB
// message limit, so the Run could not be written).
const DefaultDecisionCandidates = 64

// check refuses a Config the control plane cannot run with; defaults
// have been applied.
func (c *Config) check() error {
	if err := c.checkRetention(); err != nil {
		return err
	}
	if err := c.checkTenants(); err != nil {
		return err
	}
	if c.Capacity != nil {
		if err := c.Capacity.Validate(); err != nil {
			return fmt.Errorf("controlplane: Capacity: %w", err)
		}
	}
	if err := c.RegistryAuth.CheckTenants(c.Tenants); err != nil {
		return fmt.Errorf("controlplane: tenant registry credentials: %w", err)
	}
	return nil
}

// timing is when the scheduler (and the lane, for its own Runs) resends a
// booked Run's commands and stops one past its max runtime.
func (c Config) timing() lifecycle.Timing {
	return lifecycle.Timing{RedispatchAfter: c.RedispatchAfter, MaxRuntimeSlack: c.MaxRuntimeSlack}
}
