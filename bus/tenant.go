package bus

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Tenancy. Every subject a producer may touch names its tenant right after
// its domain word, so the auth callout confines a producer to its tenant by
// subject alone (PermsProducer):
//
//	wf.runs.<tenant>.<identity>.submit|cancel   into the tenant's own WF_RUNS_<tenant>
//	wf.events.<tenant>.run.<run_id>              a Run's events (WF_EVENTS)
//	wf.logs.<tenant>.run.<run_id>                a Run's output (WF_LOGS)
//	wf.logs.<tenant>.session.<session>           a resident session's output (WF_LOGS)
//	wf.tenant.<tenant>.<service>                 the control plane's per-tenant services
//
// The submit and cancel subjects name the identity too: JetStream does not
// say who published a message, and the callout lets an identity publish
// under its own name only, so intake reads the submitter off the subject.

// SubmitSubject is where identity, of tenant, submits a RunRequest.
func SubmitSubject(tenant, identity string) string {
	return "wf.runs." + tenant + "." + identity + ".submit"
}

// CancelSubject is where identity, of tenant, cancels a Run.
func CancelSubject(tenant, identity string) string {
	return "wf.runs." + tenant + "." + identity + ".cancel"
}

// RunsStream is tenant's intake stream. Each tenant has its own: JetStream
// dedupes Nats-Msg-Id per stream, so one tenant's message ids can never
// shadow another's, and one tenant's flood queues behind its own consumer.
func RunsStream(tenant string) string { return "WF_RUNS_" + tenant }

// RunEventsSubject is the subject of one Run's events.
func RunEventsSubject(tenant, runID string) string { return "wf.events." + tenant + ".run." + runID }

// SessionEventsSubject is the subject of one session's events.
func SessionEventsSubject(tenant, session string) string {
	return "wf.events." + tenant + ".session." + session
}

// RunLogsSubject is the subject of one Run's output, every attempt's.
func RunLogsSubject(tenant, runID string) string { return "wf.logs." + tenant + ".run." + runID }

// SessionLogsSubject is the subject of one resident session's output.
func SessionLogsSubject(tenant, session string) string {
	return "wf.logs." + tenant + ".session." + session
}

// SubjectTenant is the tenant a wf.tenant.<tenant>.… subject names, ""
// for any other subject.
func SubjectTenant(subject string) string {
	rest, ok := strings.CutPrefix(subject, "wf.tenant.")
	if !ok {
		return ""
	}
	t, _, _ := strings.Cut(rest, ".")
	return t
}

// TenantSubject is the subject of one of the control plane's per-tenant
// services (op, e.g. TenantRunsGet).
func TenantSubject(tenant, op string) string { return "wf.tenant." + tenant + "." + op }

// The per-tenant services' operations (TenantSubject).
const (
	TenantRunsGet   = "runs.get"   // one Run record of the tenant
	TenantRunsList  = "runs.list"  // the tenant's Runs
	TenantRunsRead  = "runs.read"  // a page of a Run's (or session's) events or output
	TenantSecretSet = "secret.set" // seal and store a secret
	TenantSecretLs  = "secret.list"
	TenantSecretRm  = "secret.rm"
)

// SubjectTenantServices is every per-tenant service subject: the control
// plane's request server subscribes here.
const SubjectTenantServices = "wf.tenant.>"

// SubjectSecretRotateKey asks the control plane to re-seal every secret
// under the key file's current sealing key (operators only).
const SubjectSecretRotateKey = "wf.admin.secret.rotate-key"

// BucketSecrets holds sealed secrets by `<tenant>.<name>`.
const BucketSecrets = "wf_secrets"

// SubjectSecretCredentials is where agents ask, at launch, for the secret
// values of a Run booked on them (core request/reply: a value is never at
// rest); NodeSecretCredentials is one node's.
const SubjectSecretCredentials = "wf.node.*.credentials.secret"

// NodeSecretCredentials is where one node asks for a booked Run's secrets.
func NodeSecretCredentials(nodeID string) string {
	return subjectNodePrefix + nodeID + ".credentials.secret"
}

// ParseIntakeSubject splits wf.runs.<tenant>.<identity>.<verb>; ok is false
// for any other form, wildcards included (verb is "submit" or "cancel").
func ParseIntakeSubject(subject string) (tenant, identity, verb string, ok bool) {
	parts := strings.Split(subject, ".")
	if len(parts) != 5 || parts[0] != "wf" || parts[1] != "runs" || !SubjectToken(parts[2]) || !SubjectToken(parts[3]) {
		return "", "", "", false
	}
	if parts[4] != "submit" && parts[4] != "cancel" {
		return "", "", "", false
	}
	return parts[2], parts[3], parts[4], true
}

// runsStreamConfig is tenant's intake stream: a work queue of its submits
// and cancels, deduped by Nats-Msg-Id within the tenant only.
func runsStreamConfig(tenant string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        RunsStream(tenant),
		Description: "Run submissions and cancellations from tenant " + tenant + "'s producers",
		Subjects:    []string{SubmitSubject(tenant, "*"), CancelSubject(tenant, "*")},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  DedupeWindow,
		Replicas:    replicas,
	}
}
