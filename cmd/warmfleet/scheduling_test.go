package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/warmfleet/warmfleet/schemas"
)

// run submit's scheduling flags land in the request: --retry-on is
// repeatable and takes comma lists; durations become whole seconds.
func TestRunSubmitSchedulingFlags(t *testing.T) {
	var f submitFlags
	fs := pflag.NewFlagSet("submit", pflag.ContinueOnError)
	f.sched.register(fs)
	if err := fs.Parse([]string{"--priority", "urgent", "--preemptible", "--retry-on", "oom,node_lost", "--retry-on", "exit_nonzero",
		"--max-attempts", "4", "--retry-backoff", "30s", "--start-deadline", "10m", "--grace", "45s"}); err != nil {
		t.Fatal(err)
	}
	f.image = testImage
	req, err := f.request([]string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	want := &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM, schemas.RetryNodeLost, schemas.RetryExitNonZero}, MaxAttempts: 4, Backoff: "30s"}
	if req.Priority != "urgent" || !req.Preemptible || !reflect.DeepEqual(req.Retry, want) || req.StartDeadlineSeconds != 600 || req.GraceSeconds != 45 {
		t.Fatalf("request %+v, retry %+v", req, req.Retry)
	}
	none, err := (&submitFlags{image: testImage}).request(nil)
	if err != nil || none.Retry != nil || none.Priority != "" || none.StartDeadlineSeconds != 0 {
		t.Fatalf("no scheduling flags: %+v, %v", none, err)
	}
}

// A scheduling flag's refusal names the flag and the field, and exits 125
// before anything is sent.
func TestRunSubmitSchedulingRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--priority", "Urgent"}, `--priority: invalid_priority: field "priority"`},
		{[]string{"--retry-on", "oom,segfault", "--max-attempts", "3"}, `--retry-on: invalid_retry: field "retry.on[1]"`},
		{[]string{"--retry-on", "oom", "--retry-on", "oom", "--max-attempts", "3"}, `field "retry.on[1]": event oom is listed twice`},
		{[]string{"--retry-on", "oom", "--max-attempts", "21"}, `--max-attempts: invalid_retry: field "retry.max_attempts"`},
		{[]string{"--retry-on", "oom", "--max-attempts", "2", "--retry-backoff", "2h"}, `--retry-backoff: invalid_retry: field "retry.backoff"`},
		{[]string{"--retry-on", "oom"}, "--retry-on needs --max-attempts"},
		{[]string{"--max-attempts", "3"}, "add --retry-on"},
		{[]string{"--start-deadline", "1500ms"}, "--start-deadline 1.5s: give whole seconds"},
		{[]string{"--start-deadline", "-1m"}, `--start-deadline: invalid_start_deadline: field "start_deadline_seconds"`},
		{[]string{"--grace", "2h"}, `--grace: invalid_grace: field "grace_seconds"`},
		{[]string{"--start-deadline", "soon"}, `"--start-deadline"`},
		{[]string{"-f", "req.json", "--priority", "urgent"}, "exclude -f"},
	} {
		var stdout, stderr syncBuffer
		args := append([]string{"run", "submit", "--image", testImage}, tc.args...)
		err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, append(args, "--", "true")...)
		var msg bytes.Buffer
		if code := exitCode(&msg, err); code != exitNoRunCode || !strings.Contains(msg.String(), tc.want) {
			t.Errorf("run submit %s: exit %d, %q; want 125 and %q", strings.Join(tc.args, " "), code, msg.String(), tc.want)
		}
	}
}

// policy check prints OK and a summary for a valid file, and the refusal
// naming the field (exit 1) for a bad one.
func TestPolicyCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, []byte(`{"priority_classes":[{"name":"urgent","value":1000,"preempts":true},{"name":"batch"}],"default_priority":"batch",
		"tenants":{"acme":{"weight":2,"cohort":"research","quota":{"gpus":{"*":16}},"budget":{"amount_usd":500,"period":"day"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"tenants":{"acme":{"budget":{"amount_usd":-1,"period":"day"}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	if err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, "policy", "check", good); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{"OK " + good, "urgent", "acme", "research", "gpus(*)=16", "500.00 USD/day"} {
		if !strings.Contains(out, want) {
			t.Errorf("policy check: no %q in\n%s", want, out)
		}
	}
	stdout = syncBuffer{}
	err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, "policy", "check", bad)
	var msg bytes.Buffer
	if code := exitCode(&msg, err); code != 1 || !strings.Contains(msg.String(), `invalid_policy: field "tenants.acme.budget.amount_usd"`) || strings.Contains(stdout.String(), "OK") {
		t.Fatalf("policy check of a bad file: exit %d, %q, stdout %q", code, msg.String(), stdout.String())
	}
}

func TestRunGetShowsScheduling(t *testing.T) { asEachReader(t, testRunGetShowsScheduling) }

// run get shows the Run's class, retry, why it waits (code and the latest
// decision's message), its attempts and their cost.
func testRunGetShowsScheduling(t *testing.T) {
	b := newLogBus(t)
	t0 := time.Now().Add(-time.Hour).UTC()
	held, ended := t0, t0.Add(30*time.Minute)
	r := schemas.Run{ID: "r-w", Phase: schemas.PhaseAccepted, Attempt: 1, CreatedAt: t0, Waiting: "quota: gpus(*) 4 of 4", WaitCode: schemas.CodeQuota,
		Request: schemas.RunRequest{RequestID: "w", Priority: "urgent", Preemptible: true, StartDeadlineSeconds: 600},
		Retry:   &schemas.RetryPolicy{On: []schemas.RetryEvent{schemas.RetryOOM}, MaxAttempts: 3, Backoff: "30s"},
		Attempts: []schemas.AttemptRecord{{Attempt: 1, NodeID: "n1", GPUs: 2, GPUModel: "H100", PricePerHour: 4, HeldFrom: &held, EndedAt: &ended,
			Outcome: schemas.CodePreempted, CostUSD: 2}},
		CostUSD: 2, Preemptions: 1}
	v, _ := json.Marshal(r)
	if _, err := b.kv.Put(context.Background(), r.ID, v); err != nil {
		t.Fatal(err)
	}
	b.event(schemas.RunEvent{RunID: r.ID, Seq: 1, Type: schemas.EventAccepted, Phase: schemas.PhaseAccepted, At: t0})
	b.event(schemas.RunEvent{RunID: r.ID, Seq: 2, Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Code: schemas.CodeNoCapacity, Message: "no node fits", At: t0})
	quota := "tenant default is at its quota: 4 of 4 GPUs (*); waits until one of its Runs ends"
	b.event(schemas.RunEvent{RunID: r.ID, Seq: 3, Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Code: schemas.CodeQuota, Message: quota, At: t0})

	var stdout, stderr syncBuffer
	if err := cliOut(b.url, &stdout, &stderr, "run", "get", r.ID); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{"Priority:", "urgent", "Preemptible:     true", "on oom, at most 3 attempts, backoff 30s", "Start deadline:  10m0s",
		"Wait code:       quota", "Wait message:    " + quota, "Preemptions:     1", "Cost:            2.00 USD",
		"ATTEMPT", "n1", "2 H100", "preempted", "30m0s", "4.00", "2.00 USD"} {
		if !strings.Contains(out, want) {
			t.Errorf("run get: no %q in\n%s", want, out)
		}
	}
	stdout = syncBuffer{}
	if err := cliOut(b.url, &stdout, &stderr, "-o", "json", "run", "get", r.ID); err != nil {
		t.Fatal(err)
	}
	var got struct {
		WaitCode    schemas.Code            `json:"wait_code"`
		WaitMessage string                  `json:"wait_message"`
		Attempts    []schemas.AttemptRecord `json:"attempts"`
		CostUSD     float64                 `json:"cost_usd"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &got); err != nil || got.WaitCode != schemas.CodeQuota || got.WaitMessage != quota || len(got.Attempts) != 1 || got.CostUSD != 2 {
		t.Fatalf("run get -o json: %v %+v\n%s", err, got, stdout.String())
	}
}

func TestRunDecisionShowsVictims(t *testing.T) { asEachReader(t, testRunDecisionShowsVictims) }

// run decision names the Runs a decision preempts and why.
func testRunDecisionShowsVictims(t *testing.T) {
	b := newLogBus(t)
	b.putRun("r-p", schemas.PhaseAccepted, 0)
	b.event(schemas.RunEvent{RunID: "r-p", Seq: 1, Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Code: schemas.CodePreempting, At: time.Now(),
		Decision: &schemas.BookingDecision{RunID: "r-p", Attempt: 1, DecidedAt: time.Now(),
			Victims: []schemas.Victim{{RunID: "r-v", NodeID: "n2", Priority: "batch", GPUSeconds: 7200, Why: "priority"}}}})
	var stdout, stderr syncBuffer
	if err := cliOut(b.url, &stdout, &stderr, "run", "decision", "r-p"); err != nil {
		t.Fatal(err)
	}
	if want := "preempts r-v on n2: priority, class batch, 7200 GPU-seconds lost"; !strings.Contains(stdout.String(), want) {
		t.Fatalf("run decision: no %q in\n%s", want, stdout.String())
	}
}

// serve refuses a policy file that does not validate before it starts
// anything, naming the flag and the field.
func TestServeRefusesBadPolicyFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(bad, []byte(`{"priority_classes":[{"name":"a"},{"name":"a"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, "serve", "--data-dir", filepath.Join(dir, "data"), "--port", "-1", "--scheduling-policy-file", bad)
	if err == nil || !strings.Contains(err.Error(), "--scheduling-policy-file") || !strings.Contains(err.Error(), `"priority_classes[1].name"`) {
		t.Fatalf("serve with a bad policy file: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "data")); serr == nil {
		t.Fatal("serve made its data directory before refusing the policy")
	}
}

// A Run waiting out a retry's backoff shows the retry, not the decision
// that placed the failed attempt before it; a later decision wins again.
func TestWaitNoteRetryBackoff(t *testing.T) {
	evs := []schemas.RunEvent{
		{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Message: "no node has 8 free GPUs"},
		{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, NodeID: "n1", Message: "booked"},
		{Type: schemas.EventPhase, From: schemas.PhaseAccepted, Phase: schemas.PhasePlaced, NodeID: "n1", Message: "booked on n1"},
		{Type: schemas.EventPhase, From: schemas.PhaseRunning, Phase: schemas.PhaseAccepted, NodeID: "n1", Code: schemas.CodeOOMKilled,
			Message: "attempt 1 on n1: oom; retry 1 of 2 after a backoff of 30s"},
	}
	var msg string
	for _, ev := range evs {
		msg = waitNote(msg, ev)
	}
	if !strings.Contains(msg, "backoff of 30s") {
		t.Fatalf("wait message after a retry = %q", msg)
	}
	if msg = waitNote(msg, schemas.RunEvent{Type: schemas.EventDecided, Phase: schemas.PhaseAccepted, Message: "tenant at its quota"}); msg != "tenant at its quota" {
		t.Fatalf("a later decision = %q", msg)
	}
}

// policy check reads the file as the control plane does: a path that is
// no regular file is refused for that, not read.
func TestPolicyCheckNotRegular(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr syncBuffer
	err := cliOut("nats://127.0.0.1:1", &stdout, &stderr, "policy", "check", dir)
	var msg bytes.Buffer
	if code := exitCode(&msg, err); code != 1 || !strings.Contains(msg.String(), "is not a regular file") {
		t.Fatalf("policy check of a directory: exit %d, %q", code, msg.String())
	}
}

// run get says how many attempts' records a Run no longer keeps.
func TestPrintAttemptsEarlierNotShown(t *testing.T) {
	r := schemas.Run{Attempt: 3, Attempts: []schemas.AttemptRecord{{Attempt: 3, NodeID: "n1"}}}
	var out bytes.Buffer
	printAttempts(&out, r, time.Now())
	if !strings.Contains(out.String(), "(2 earlier attempts not shown)") {
		t.Fatalf("attempts:\n%s", out.String())
	}
	r.Attempts[0].Attempt, r.Attempt = 1, 1
	out.Reset()
	if printAttempts(&out, r, time.Now()); strings.Contains(out.String(), "not shown") {
		t.Fatalf("all attempts kept:\n%s", out.String())
	}
}
