package queue

import (
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestUnsatisfiable(t *testing.T) {
	refused := func(code schemas.Code) schemas.Candidate { return schemas.Candidate{NodeID: "n", Reason: code} }
	for _, tc := range []struct {
		name  string
		cands []schemas.Candidate
		want  bool
	}{
		{"no nodes: one may enroll", nil, false},
		{"every node too small", []schemas.Candidate{refused(schemas.ReasonInsufficientCPU), refused(schemas.ReasonInsufficientGPU)}, true},
		{"wrong platform and no cache mounts", []schemas.Candidate{refused(schemas.ReasonPlatformMismatch), refused(schemas.ReasonCacheMountsUnsupported)}, true},
		{"one node only draining", []schemas.Candidate{refused(schemas.ReasonInsufficientCPU), refused(schemas.ReasonNodeDraining)}, false},
		{"one node's facts stale", []schemas.Candidate{refused(schemas.ReasonFactsStale)}, false},
		{"one node busy", []schemas.Candidate{refused(schemas.ReasonInsufficientCPU), refused(schemas.ReasonQueueFull)}, false},
		{"one node eligible", []schemas.Candidate{refused(schemas.ReasonInsufficientCPU), {NodeID: "m", Eligible: true}}, false},
	} {
		if got := Unsatisfiable(schemas.BookingDecision{Candidates: tc.cands}); got != tc.want {
			t.Errorf("%s: unsatisfiable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
