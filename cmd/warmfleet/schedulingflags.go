package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/warmfleet/warmfleet/schemas"
)

// schedulingFlags are run submit's say in who runs first: the priority
// class, preemptibility, the retry policy, the start deadline and the
// stop grace (docs/scheduling.md).
type schedulingFlags struct {
	priority      string
	preemptible   bool
	retryOn       []string
	maxAttempts   int
	retryBackoff  string
	startDeadline time.Duration
	grace         time.Duration
}

func (s *schedulingFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&s.priority, "priority", "", "priority class of the control plane's scheduling policy (default: the policy's default class)")
	fl.BoolVar(&s.preemptible, "preemptible", false, "let a higher class, or a tenant reclaiming lent quota, stop this Run and requeue it")
	fl.StringSliceVar(&s.retryOn, "retry-on", nil, "retry an attempt that ends in: "+schemas.RetryEventNames()+" (repeatable or comma-separated; needs --max-attempts)")
	fl.IntVar(&s.maxAttempts, "max-attempts", 0, fmt.Sprintf("with --retry-on: attempts in all, counting the first, 1-%d (preempted attempts do not count)", schemas.MaxRetryAttempts))
	fl.StringVar(&s.retryBackoff, "retry-backoff", "", "with --retry-on: wait before the first retry, doubling for each after, e.g. 30s (at most 1h)")
	fl.DurationVar(&s.startDeadline, "start-deadline", 0, "fail the Run deadline_exceeded if it has not started running this long after it was accepted, e.g. 10m (0: no deadline)")
	fl.DurationVar(&s.grace, "grace", 0, fmt.Sprintf("how long the Run is given to stop when the control plane stops it before it is killed (default %ds)", schemas.DefaultGraceSeconds))
}

// set reports whether any of the flags was given.
func (s *schedulingFlags) set() bool {
	return s.priority != "" || s.preemptible || len(s.retryOn) > 0 || s.maxAttempts != 0 || s.retryBackoff != "" || s.startDeadline != 0 || s.grace != 0
}

// apply puts the flags into req; Validate checks the values after.
func (s *schedulingFlags) apply(req *schemas.RunRequest) error {
	req.Priority, req.Preemptible = s.priority, s.preemptible
	if len(s.retryOn) > 0 || s.maxAttempts != 0 || s.retryBackoff != "" {
		if len(s.retryOn) == 0 {
			return errors.New("--max-attempts and --retry-backoff shape a retry policy: add --retry-on with the endings to retry (" + schemas.RetryEventNames() + ")")
		}
		if s.maxAttempts == 0 {
			return fmt.Errorf("--retry-on needs --max-attempts: how many attempts in all, counting the first (1-%d)", schemas.MaxRetryAttempts)
		}
		r := &schemas.RetryPolicy{MaxAttempts: s.maxAttempts, Backoff: s.retryBackoff}
		for _, e := range s.retryOn {
			r.On = append(r.On, schemas.RetryEvent(strings.TrimSpace(e)))
		}
		req.Retry = r
	}
	var err error
	if req.StartDeadlineSeconds, err = wholeSeconds("--start-deadline", s.startDeadline); err != nil {
		return err
	}
	req.GraceSeconds, err = wholeSeconds("--grace", s.grace)
	return err
}

func wholeSeconds(flag string, d time.Duration) (int64, error) {
	if d%time.Second != 0 {
		return 0, fmt.Errorf("%s %s: give whole seconds, e.g. 90s or 10m", flag, d)
	}
	return int64(d / time.Second), nil
}

// schedulingFlagOf names the flag a refusal of a scheduling field is
// about, or "" for another field.
func schedulingFlagOf(err error) string {
	var r *schemas.Refusal
	if !errors.As(err, &r) {
		return ""
	}
	switch {
	case r.Field == "priority":
		return "--priority"
	case strings.HasPrefix(r.Field, "retry.on"):
		return "--retry-on"
	case r.Field == "retry.max_attempts":
		return "--max-attempts"
	case r.Field == "retry.backoff":
		return "--retry-backoff"
	case r.Field == "start_deadline_seconds":
		return "--start-deadline"
	case r.Field == "grace_seconds":
		return "--grace"
	}
	return ""
}
