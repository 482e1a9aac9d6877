package schemas

import (
	"errors"
	"regexp"
	"strconv"
	"time"
)

// priorityNamePattern is the syntax of a priority class name, in a Run's
// priority and in the policy file's priority_classes; cohorts share it.
var priorityNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidPriorityName reports whether name can name a priority class.
func ValidPriorityName(name string) bool { return priorityNamePattern.MatchString(name) }

// RetryEvents lists every RetryEvent, in the order the docs give them.
var RetryEvents = []RetryEvent{RetryExitNonZero, RetryOOM, RetryNodeLost, RetryInterrupted, RetryLaunchFailed}

func knownRetryEvent(e RetryEvent) bool {
	for _, k := range RetryEvents {
		if e == k {
			return true
		}
	}
	return false
}

// RetryEventNames is the retry events as the docs spell them,
// comma-separated, for messages and help.
func RetryEventNames() string {
	s := ""
	for i, e := range RetryEvents {
		if i > 0 {
			s += ", "
		}
		s += string(e)
	}
	return s
}

// validateScheduling checks a Run's scheduling fields: the priority's
// syntax (whether the policy defines the class is intake's question), the
// retry policy, the start deadline and the stop grace.
func (r *RunRequest) validateScheduling() error {
	if r.Priority != "" && !ValidPriorityName(r.Priority) {
		return refuse(CodeInvalidPriority, "priority", "a priority class name is 1-63 characters of [a-z0-9_-], starting with a letter or digit; leave it empty for the default class")
	}
	if r.Retry != nil {
		if err := r.Retry.Validate("retry", CodeInvalidRetry); err != nil {
			return err
		}
	}
	if r.StartDeadlineSeconds < 0 || r.StartDeadlineSeconds > MaxStartDeadlineSeconds {
		return refuse(CodeInvalidDeadline, "start_deadline_seconds", "must be between 0 (no deadline) and %d seconds", MaxStartDeadlineSeconds)
	}
	if !r.Spot.Valid() {
		return refuse(CodeInvalidSpot, "spot", "is never (on-demand only, the default), allowed (spot or on-demand, whichever is expected sooner and cheaper) or only (spot only); leave it empty for the tenant's policy")
	}
	if r.GraceSeconds < 0 || r.GraceSeconds > MaxGraceSeconds {
		return refuse(CodeInvalidGrace, "grace_seconds", "must be between 0 (default %ds) and %d", DefaultGraceSeconds, MaxGraceSeconds)
	}
	return nil
}

// Validate refuses a retry policy with code, naming the offending field
// under field ("retry" in a request, "tenants.acme.retry" in a policy
// file): unknown or repeated events, max_attempts outside
// 1..MaxRetryAttempts, a backoff that is no Go duration or outside
// 0..MaxRetryBackoff.
func (p *RetryPolicy) Validate(field string, code Code) error {
	if len(p.On) > len(RetryEvents) {
		return refuse(code, field+".on", "at most %d events, each once: %s", len(RetryEvents), RetryEventNames())
	}
	for i, e := range p.On {
		f := field + ".on[" + strconv.Itoa(i) + "]"
		if !knownRetryEvent(e) {
			return refuse(code, f, "not a retry event; use one of %s", RetryEventNames())
		}
		for _, prev := range p.On[:i] {
			if prev == e {
				return refuse(code, f, "event %s is listed twice; list each once", e)
			}
		}
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > MaxRetryAttempts {
		return refuse(code, field+".max_attempts", "must be between 1 (never retry) and %d, counting the first attempt", MaxRetryAttempts)
	}
	if _, err := p.BackoffDuration(); err != nil {
		return refuse(code, field+".backoff", "%s", err.Error())
	}
	return nil
}

// BackoffDuration is Backoff parsed (0 when empty); an error says why it
// is no backoff.
func (p *RetryPolicy) BackoffDuration() (time.Duration, error) {
	if p.Backoff == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(p.Backoff)
	if err != nil || len(p.Backoff) > 32 {
		return 0, errBackoff
	}
	if d < 0 || d > MaxRetryBackoff {
		return 0, errBackoff
	}
	return d, nil
}

// errBackoff does not echo the value back.
var errBackoff = errors.New("a Go duration between 0s and 1h, such as 30s or 5m (empty: retry at once)")
