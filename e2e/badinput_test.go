package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_BadRunRequests: each malformed request is refused with its
// own coded rejected event, no Run is created, the intake message is not
// redelivered, and intake keeps working afterwards.
func TestAcceptance_BadRunRequests(t *testing.T) {
	f := newFleet(t)
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	img := "localhost/busybox@" + digest
	mp := func(v any) []byte {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.SetCustomStructTag("json")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	cases := []struct {
		name      string
		requestID string // the request id inside the body, if any
		body      []byte
		code      schemas.Code
		field     string
	}{
		{"malformed json", "", []byte(`{"request_id": "bad-1", "image": `), schemas.CodeMalformed, ""},
		{"malformed msgpack", "", []byte{0xc1, 0x00, 0xff}, schemas.CodeMalformed, ""},
		{"json array", "", []byte(`{"request_id":["x"]}`), schemas.CodeMalformed, ""},
		{"unknown field", "bad-4", []byte(`{"request_id":"bad-4","image":"` + img + `","gpu_model":"h100"}`), schemas.CodeUnknownField, "gpu_model"},
		{"unknown field msgpack", "", mp(map[string]any{"request_id": "bad-5", "image": img, "urgency": 9}), schemas.CodeUnknownField, "urgency"},
		{"missing request id", "", []byte(`{"image":"` + img + `"}`), schemas.CodeMissingField, "request_id"},
		{"bad request id", "", []byte(`{"request_id":"has spaces","image":"` + img + `"}`), schemas.CodeInvalidRequestID, "request_id"},
		{"missing image", "bad-8", []byte(`{"request_id":"bad-8"}`), schemas.CodeMissingField, "image"},
		{"tag instead of digest", "bad-9", []byte(`{"request_id":"bad-9","image":"busybox:latest"}`), schemas.CodeImageNotPinned, "image"},
		{"short digest", "bad-10", []byte(`{"request_id":"bad-10","image":"busybox@sha256:abc"}`), schemas.CodeInvalidDigest, "image"},
		{"bad repository", "bad-11", []byte(`{"request_id":"bad-11","image":"Bad Repo@` + digest + `"}`), schemas.CodeInvalidImage, "image"},
		{"negative cpu", "bad-12", []byte(`{"request_id":"bad-12","image":"` + img + `","resources":{"cpu_millis":-5}}`), schemas.CodeNegativeResource, "resources.cpu_millis"},
		{"negative memory", "bad-13", []byte(`{"request_id":"bad-13","image":"` + img + `","resources":{"memory_bytes":-1}}`), schemas.CodeNegativeResource, "resources.memory_bytes"},
		{"too many gpus", "bad-14", []byte(`{"request_id":"bad-14","image":"` + img + `","resources":{"gpu_count":1000}}`), schemas.CodeResourceTooLarge, "resources.gpu_count"},
		{"bad env name", "bad-15", []byte(`{"request_id":"bad-15","image":"` + img + `","env":{"1BAD":"x"}}`), schemas.CodeInvalidEnv, "env"},
		{"negative max runtime", "bad-16", []byte(`{"request_id":"bad-16","image":"` + img + `","max_runtime_seconds":-1}`), schemas.CodeInvalidMaxRuntime, "max_runtime_seconds"},
		{"future version", "bad-17", []byte(`{"version":9,"request_id":"bad-17","image":"` + img + `"}`), schemas.CodeUnsupportedVersion, "version"},
		{"oversize payload", "", []byte(`{"request_id":"bad-18","image":"` + img + `","args":["` + strings.Repeat("x", schemas.MaxRunRequestBytes) + `"]}`), schemas.CodePayloadTooLarge, ""},
		{"bad label", "bad-19", []byte(`{"request_id":"bad-19","image":"` + img + `","labels":{"-x":"y"}}`), schemas.CodeInvalidLabel, "labels"},
		{"unknown network", "bad-20", []byte(`{"request_id":"bad-20","image":"` + img + `","network":"overlay"}`), schemas.CodeInvalidNetwork, "network"},
		{"unknown ulimit", "bad-21", []byte(`{"request_id":"bad-21","image":"` + img + `","ulimits":[{"name":"files","soft":1,"hard":1}]}`), schemas.CodeInvalidUlimit, "ulimits[0].name"},
		{"ulimit soft above hard", "bad-22", []byte(`{"request_id":"bad-22","image":"` + img + `","ulimits":[{"name":"nofile","soft":4096,"hard":1024}]}`), schemas.CodeInvalidUlimit, "ulimits[0].soft"},
		{"negative shm", "bad-23", []byte(`{"request_id":"bad-23","image":"` + img + `","shm_bytes":-1}`), schemas.CodeInvalidShm, "shm_bytes"},
		{"unknown retry event", "bad-24", []byte(`{"request_id":"bad-24","image":"` + img + `","retry":{"on":["segfault"],"max_attempts":2}}`), schemas.CodeInvalidRetry, "retry.on[0]"},
		{"negative start deadline", "bad-25", []byte(`{"request_id":"bad-25","image":"` + img + `","start_deadline_seconds":-1}`), schemas.CodeInvalidDeadline, "start_deadline_seconds"},
		{"empty body", "", []byte(` `), schemas.CodeMalformed, ""},
	}
	before := f.rejectedCount()
	for _, c := range cases {
		f.publish(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), c.body, "")
	}
	// Every one refused, in order, each with its code and field.
	var rejected []schemas.RunEvent
	f.eventually(60*time.Second, "all rejections", func() bool {
		rejected = f.rejections(before)
		return len(rejected) >= len(cases)
	})
	if len(rejected) != len(cases) {
		t.Fatalf("%d rejected events for %d bad requests", len(rejected), len(cases))
	}
	for i, c := range cases {
		ev := rejected[i]
		if ev.Code != c.code || ev.Field != c.field {
			t.Errorf("%s: refused with %s/%q, want %s/%q (%s)", c.name, ev.Code, ev.Field, c.code, c.field, ev.Message)
		}
		if ev.Message == "" {
			t.Errorf("%s: refusal says nothing about what to do", c.name)
		}
		if c.requestID != "" && ev.RunID != schemas.RunIDFor(schemas.DefaultTenant, c.requestID) {
			t.Errorf("%s: rejection on %s, want the subject of the Run its request id names", c.name, ev.RunID)
		}
	}
	// No Run was created and nothing waits for redelivery.
	kv, err := f.conn.JS.KeyValue(context.Background(), bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := kv.ListKeys(context.Background()); err == nil {
		for k := range keys.Keys() {
			t.Errorf("a bad request created run %s", k)
		}
	}
	f.eventually(30*time.Second, "WF_RUNS to drain", func() bool {
		s, err := f.conn.JS.Stream(context.Background(), bus.RunsStream(schemas.DefaultTenant))
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})

	// Intake still works: a good request is accepted after all of them.
	good := f.submit(schemas.RunRequest{RequestID: "good-after-bad", Image: img})
	f.waitPhase(good, schemas.PhaseAccepted, 30*time.Second)
	// And a request id reused with a different body is refused, not merged.
	f.publish(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"request_id":"good-after-bad","image":"`+img+`","command":["other"]}`), "")
	f.eventually(30*time.Second, "conflict rejection", func() bool {
		for _, ev := range f.events(good) {
			if ev.Type == schemas.EventRejected && ev.Code == schemas.CodeRequestIDConflict {
				return true
			}
		}
		return false
	})
	if r, _ := f.run(good); len(r.Request.Command) != 0 {
		t.Fatalf("conflicting resubmit changed the stored request: %v", r.Request.Command)
	}
	// Bad cancels are refused too.
	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"run_id":"r-doesnotexist"}`), "")
	f.publish(bus.CancelSubject(schemas.DefaultTenant, bus.OperatorUser), []byte(`{"nope":1}`), "")
	f.eventually(30*time.Second, "cancel rejections", func() bool {
		evs := f.rejections(before)
		var codes []string
		for _, e := range evs[len(cases):] {
			codes = append(codes, string(e.Code))
		}
		return strings.Contains(fmt.Sprint(codes), string(schemas.CodeRunNotFound)) && strings.Contains(fmt.Sprint(codes), string(schemas.CodeUnknownField))
	})
}

// rejections returns the rejected events published after the first skip.
func (f *fleet) rejections(skip int) []schemas.RunEvent {
	var out []schemas.RunEvent
	for _, ev := range f.allEvents() {
		if ev.Type == schemas.EventRejected {
			out = append(out, ev)
		}
	}
	if skip > len(out) {
		return nil
	}
	return out[skip:]
}

func (f *fleet) rejectedCount() int { return len(f.rejections(0)) }
