package schemas_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// A Run's scheduling fields are refused with their own codes, naming the
// field down to the offending list item.
func TestRunRequestSchedulingFields(t *testing.T) {
	retry := func(on []any, max any, backoff any) map[string]any {
		m := map[string]any{"on": on, "max_attempts": max}
		if backoff != nil {
			m["backoff"] = backoff
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		body  map[string]any
		code  schemas.Code
		field string
	}{
		{"valid all", req("priority", "urgent", "preemptible", true, "retry", retry([]any{"oom", "node_lost", "exit_nonzero", "interrupted", "launch_failed"}, 20, "1h"),
			"start_deadline_seconds", schemas.MaxStartDeadlineSeconds, "grace_seconds", schemas.MaxGraceSeconds), "", ""},
		{"valid empty retry list", req("retry", retry([]any{}, 1, nil)), "", ""},
		{"spot allowed", req("spot", "allowed"), "", ""},
		{"spot only", req("spot", "only"), "", ""},
		{"spot never", req("spot", "never"), "", ""},
		{"spot unknown", req("spot", "sometimes"), schemas.CodeInvalidSpot, "spot"},
		{"spot upper case", req("spot", "Allowed"), schemas.CodeInvalidSpot, "spot"},
		{"valid zero backoff", req("retry", retry([]any{"oom"}, 3, "0s")), "", ""},
		{"priority upper case", req("priority", "Urgent"), schemas.CodeInvalidPriority, "priority"},
		{"priority too long", req("priority", strings.Repeat("p", 64)), schemas.CodeInvalidPriority, "priority"},
		{"priority leading dash", req("priority", "-x"), schemas.CodeInvalidPriority, "priority"},
		{"retry unknown event", req("retry", retry([]any{"oom", "segfault"}, 3, nil)), schemas.CodeInvalidRetry, "retry.on[1]"},
		{"retry duplicate event", req("retry", retry([]any{"oom", "node_lost", "oom"}, 3, nil)), schemas.CodeInvalidRetry, "retry.on[2]"},
		{"retry zero attempts", req("retry", retry([]any{"oom"}, 0, nil)), schemas.CodeInvalidRetry, "retry.max_attempts"},
		{"retry too many attempts", req("retry", retry([]any{"oom"}, 21, nil)), schemas.CodeInvalidRetry, "retry.max_attempts"},
		{"retry backoff unparsable", req("retry", retry([]any{"oom"}, 3, "soon")), schemas.CodeInvalidRetry, "retry.backoff"},
		{"retry backoff negative", req("retry", retry([]any{"oom"}, 3, "-1s")), schemas.CodeInvalidRetry, "retry.backoff"},
		{"retry backoff over an hour", req("retry", retry([]any{"oom"}, 3, "61m")), schemas.CodeInvalidRetry, "retry.backoff"},
		{"retry unknown field", req("retry", map[string]any{"on": []any{}, "max_attempts": 1, "jitter": "1s"}), schemas.CodeUnknownField, "jitter"},
		{"deadline negative", req("start_deadline_seconds", -1), schemas.CodeInvalidDeadline, "start_deadline_seconds"},
		{"deadline too long", req("start_deadline_seconds", schemas.MaxStartDeadlineSeconds+1), schemas.CodeInvalidDeadline, "start_deadline_seconds"},
		{"grace negative", req("grace_seconds", -1), schemas.CodeInvalidGrace, "grace_seconds"},
		{"grace too long", req("grace_seconds", schemas.MaxGraceSeconds+1), schemas.CodeInvalidGrace, "grace_seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := schemas.DecodeRunRequest(jsonHeader(), jsonBody(t, tc.body))
			checkRefusal(t, err, tc.code, tc.field)
		})
	}
}

func checkRefusal(t *testing.T, err error, code schemas.Code, field string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	var r *schemas.Refusal
	if !errors.As(err, &r) || r.Code != code || r.Field != field || r.Reason == "" {
		t.Fatalf("got %v, want %s naming %q", err, code, field)
	}
}

const examplePolicy = `{"priority_classes":[{"name":"urgent","value":1000,"preempts":true},{"name":"batch","value":0},{"name":"scavenger","value":-100}],
 "default_priority":"batch", "gpu_hour_price": 2.5, "owned_gpu_hour_rates":{"H100":2.0,"*":1.0},
 "tenants":{"acme":{"weight":2,"cohort":"research","quota":{"runs":50,"gpus":{"*":16,"H100":8},"cpu_millis":64000,"memory_bytes":274877906944},
   "budget":{"amount_usd":500,"period":"day"},"retry":{"on":["node_lost","oom"],"max_attempts":3,"backoff":"30s"}}},
 "default":{"weight":1}}`

func TestParseSchedulingPolicy(t *testing.T) {
	p, err := schemas.ParseSchedulingPolicy([]byte(examplePolicy))
	if err != nil {
		t.Fatal(err)
	}
	acme := p.Tenants["acme"]
	if p.DefaultPriority != "batch" || len(p.PriorityClasses) != 3 || acme.Quota.GPUs["H100"] != 8 || *acme.Quota.Runs != 50 ||
		acme.Budget.AmountUSD != 500 || acme.Retry.MaxAttempts != 3 || p.ClassNames() != "urgent, batch, scavenger" {
		t.Fatalf("parsed %+v", p)
	}
	if _, err := schemas.ParseSchedulingPolicy([]byte(`{}`)); err != nil {
		t.Fatalf("empty policy: %v", err)
	}

	for _, tc := range []struct {
		name, body string
		field      string
	}{
		{"unknown field", `{"tenants":{"acme":{"quota":{"gpu":4}}}}`, "gpu"},
		{"not json", `{"priority_classes":`, ""},
		{"trailing data", `{} {}`, ""},
		{"too large", `{"default":{}}` + strings.Repeat(" ", schemas.MaxPolicyBytes), ""},
		{"class name malformed", `{"priority_classes":[{"name":"ok"},{"name":"Not OK"}]}`, "priority_classes[1].name"},
		{"class name duplicate", `{"priority_classes":[{"name":"a","value":1},{"name":"a","value":2}]}`, "priority_classes[1].name"},
		{"class value huge", `{"priority_classes":[{"name":"a","value":2000000000}]}`, "priority_classes[0].value"},
		{"default names no class", `{"priority_classes":[{"name":"a"}],"default_priority":"b"}`, "default_priority"},
		{"default without classes", `{"default_priority":"b"}`, "default_priority"},
		{"negative gpu hour price", `{"gpu_hour_price":-1}`, "gpu_hour_price"},
		{"negative owned rate", `{"owned_gpu_hour_rates":{"H100":-2}}`, "owned_gpu_hour_rates.H100"},
		{"empty owned rate key", `{"owned_gpu_hour_rates":{"":2}}`, `owned_gpu_hour_rates.""`},
		{"tenant name", `{"tenants":{"Acme":{}}}`, "tenants.Acme"},
		{"negative weight", `{"tenants":{"acme":{"weight":-1}}}`, "tenants.acme.weight"},
		{"huge weight", `{"default":{"weight":1e7}}`, "default.weight"},
		{"cohort", `{"tenants":{"acme":{"cohort":"R&D"}}}`, "tenants.acme.cohort"},
		{"negative runs quota", `{"tenants":{"acme":{"quota":{"runs":-1}}}}`, "tenants.acme.quota.runs"},
		{"negative cpu quota", `{"tenants":{"acme":{"quota":{"cpu_millis":-1}}}}`, "tenants.acme.quota.cpu_millis"},
		{"negative memory quota", `{"tenants":{"acme":{"quota":{"memory_bytes":-1}}}}`, "tenants.acme.quota.memory_bytes"},
		{"negative gpu quota", `{"tenants":{"acme":{"quota":{"gpus":{"*":4,"A100":-1}}}}}`, "tenants.acme.quota.gpus.A100"},
		{"negative budget", `{"tenants":{"acme":{"budget":{"amount_usd":-5,"period":"day"}}}}`, "tenants.acme.budget.amount_usd"},
		{"unknown period", `{"tenants":{"acme":{"budget":{"amount_usd":5,"period":"year"}}}}`, "tenants.acme.budget.period"},
		{"missing period", `{"default":{"budget":{"amount_usd":5}}}`, "default.budget.period"},
		{"retry event", `{"tenants":{"acme":{"retry":{"on":["oom","boom"],"max_attempts":2}}}}`, "tenants.acme.retry.on[1]"},
		{"retry attempts", `{"default":{"retry":{"on":["oom"],"max_attempts":0}}}`, "default.retry.max_attempts"},
		{"retry backoff", `{"default":{"retry":{"on":["oom"],"max_attempts":2,"backoff":"2h"}}}`, "default.retry.backoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := schemas.ParseSchedulingPolicy([]byte(tc.body))
			checkRefusal(t, err, schemas.CodeInvalidPolicy, tc.field)
		})
	}
}

// Numbers JSON cannot carry still reach Validate from Go callers.
func TestSchedulingPolicyValidateNonFinite(t *testing.T) {
	for _, tc := range []struct {
		p     schemas.SchedulingPolicy
		field string
	}{
		{schemas.SchedulingPolicy{GPUHourPrice: math.Inf(1)}, "gpu_hour_price"},
		{schemas.SchedulingPolicy{Default: schemas.TenantPolicy{Weight: math.NaN()}}, "default.weight"},
		{schemas.SchedulingPolicy{Tenants: map[string]schemas.TenantPolicy{"acme": {Budget: &schemas.Budget{AmountUSD: math.NaN(), Period: "day"}}}}, "tenants.acme.budget.amount_usd"},
	} {
		checkRefusal(t, tc.p.Validate(), schemas.CodeInvalidPolicy, tc.field)
	}
}

func FuzzSchedulingPolicy(f *testing.F) {
	f.Add([]byte(examplePolicy))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := schemas.ParseSchedulingPolicy(body)
		if err != nil {
			var r *schemas.Refusal
			if !errors.As(err, &r) || r.Code != schemas.CodeInvalidPolicy || r.Reason == "" {
				t.Fatalf("error %T %v, want an invalid_policy refusal with a reason", err, err)
			}
			if len(r.Field) > 200 {
				t.Fatalf("field path of %d bytes", len(r.Field))
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed policy does not validate: %v", err)
		}
		b := jsonBody(t, p)
		again, err := schemas.ParseSchedulingPolicy(b)
		if err != nil {
			t.Fatalf("re-encoded policy refused: %v\n%s", err, b)
		}
		if string(jsonBody(t, again)) != string(b) {
			t.Fatalf("JSON round trip changed the policy:\n%s\n%s", b, jsonBody(t, again))
		}
	})
}
