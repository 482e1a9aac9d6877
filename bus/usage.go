package bus

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Ended attempts' costs. The control plane publishes each attempt's
// schemas.UsageRecord once it ends, on its tenant's UsageSubject, with
// Nats-Msg-Id UsageMsgID: the budgets' ledger and `warmfleet usage` sum
// them. Only the control plane and operators reach WF_USAGE; producers'
// logins name no wf.usage subject.
const (
	StreamUsage = "WF_USAGE"
	// SubjectUsageAll is WF_USAGE's subjects.
	SubjectUsageAll = "wf.usage.>"

	// UsageMaxAge keeps a year of records and a month over, for yearly
	// reports beside the budgets' month.
	UsageMaxAge = 400 * 24 * time.Hour
	// UsageMaxBytes and UsageMaxMsgs bound the stream whatever the rate of
	// attempts (a record is about 300 bytes); the oldest go first.
	UsageMaxBytes = 4 << 30
	UsageMaxMsgs  = 8_000_000
	// UsageDuplicates is how long a record's Nats-Msg-Id is remembered: an
	// outbox published again by a repair (the next scheduling pass, or a
	// redelivered observation) comes well within it.
	UsageDuplicates = 24 * time.Hour
)

// UsageSubject is where tenant's ended attempts' records are published.
func UsageSubject(tenant string) string { return "wf.usage." + tenant }

// UsageMsgID is the Nats-Msg-Id of attempt attemptID's record: one record
// per attempt however often its outbox is published.
func UsageMsgID(attemptID string) string { return "usage:" + attemptID }

// usageStreamConfig keeps usage records by age, bounded in size.
func usageStreamConfig(r int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamUsage,
		Description: "ended attempts' costs (schemas.UsageRecord), per tenant",
		Subjects:    []string{SubjectUsageAll},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		MaxAge:      UsageMaxAge,
		MaxBytes:    UsageMaxBytes,
		MaxMsgs:     UsageMaxMsgs,
		MaxMsgSize:  64 << 10,
		Duplicates:  UsageDuplicates,
		Replicas:    r,
	}
}
