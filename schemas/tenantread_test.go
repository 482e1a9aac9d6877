package schemas_test

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzRunsGetRequestDecode is a producer's wf.tenant.<t>.runs.get body.
func FuzzRunsGetRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.RunsGetRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if r.RunID == "" || strings.ContainsAny(r.RunID, ".*> ") {
			t.Fatalf("valid get names no one-token run: %q", r.RunID)
		}
		reencode(t, &r)
	})
}

// FuzzRunsListRequestDecode is a producer's wf.tenant.<t>.runs.list body.
func FuzzRunsListRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.RunsListRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if r.Limit < 0 || r.Limit > schemas.MaxRunsList {
			t.Fatalf("valid list out of bounds: %+v", r)
		}
		reencode(t, &r)
	})
}

// FuzzRunsReadRequestDecode is a producer's wf.tenant.<t>.runs.read body.
func FuzzRunsReadRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.RunsReadRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		name := r.RunID
		if r.Kind == schemas.ReadSessionLogs {
			name = r.Session
		}
		if name == "" || strings.ContainsAny(name, ".*> ") || (r.RunID != "" && r.Session != "") {
			t.Fatalf("valid read names no one-token subject: %+v", r)
		}
		if r.Max < 0 || r.Max > schemas.MaxReadMessages || time.Duration(r.WaitMillis)*time.Millisecond > schemas.MaxReadWait || r.WaitMillis < 0 {
			t.Fatalf("valid read out of bounds: %+v", r)
		}
		reencode(t, &r)
	})
}

func TestRunsReadRequestRefusals(t *testing.T) {
	for _, c := range []struct {
		req   schemas.RunsReadRequest
		field string
	}{
		{schemas.RunsReadRequest{Kind: "events"}, "run_id"},
		{schemas.RunsReadRequest{Kind: "logs", RunID: "r-1.x"}, "run_id"},
		{schemas.RunsReadRequest{Kind: "logs", RunID: "r-1", Session: "s"}, "session"},
		{schemas.RunsReadRequest{Kind: "session_logs", Session: "a.>"}, "session"},
		{schemas.RunsReadRequest{Kind: "stdout", RunID: "r-1"}, "kind"},
		{schemas.RunsReadRequest{Kind: "logs", RunID: "r-1", Max: schemas.MaxReadMessages + 1}, "max"},
		{schemas.RunsReadRequest{Kind: "logs", RunID: "r-1", WaitMillis: 10_001}, "wait_ms"},
	} {
		err := c.req.Validate()
		if r, ok := err.(*schemas.Refusal); !ok || r.Field != c.field {
			t.Errorf("%+v: %v, want a refusal naming %s", c.req, err, c.field)
		}
	}
	ok := schemas.RunsReadRequest{Kind: "session_logs", Session: "train", Max: 10, WaitMillis: 10_000}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}
