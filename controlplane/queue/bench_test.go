package queue

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/schemas"
)

// BenchmarkPass50kWaiting plans passes over 50,000 waiting Runs on a full
// fleet of 200 nodes (eight cards each, every queue full), one Run on one
// node ending between passes. It reports the placement decisions a pass
// makes and the nanoseconds a pass takes (fleet snapshot and plan, one
// goroutine; ns/op adds the simulation's own bookkeeping), and, measured on the same fleet in the same run, the floor
// the old rule pays: a decision for every waiting Run each pass (sampled
// over 500 Runs and scaled to 50,000).
func BenchmarkPass50kWaiting(b *testing.B) {
	const nodes, waiting = 200, 50_000
	s := newSim(b, schemas.SchedulingPolicy{})
	for i := range nodes {
		s.node(fmt.Sprintf("node-%03d", i), 64000, 8, "NVIDIA H100 80GB HBM3")
	}
	for range waiting + nodes*(8+placement.MaxQueued) {
		s.submit(fmt.Sprintf("t%d", s.seq%5), 8000, 1)
	}
	s.pass() // books what the fleet can run and queue; the rest wait
	s.pass()
	setup := s.decisions
	s.planTime = 0
	passDecisions := 0
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		node := s.nodes[i%nodes].NodeID
		for _, r := range s.sorted() {
			if r.NodeID == node && !r.Queued && r.Phase != schemas.PhaseAccepted {
				s.end(r.ID)
				break
			}
		}
		s.now = s.now.Add(time.Second)
		s.startQueued()
		b.StartTimer()
		res := s.pass()
		passDecisions += res.Decisions
	}
	b.StopTimer()
	b.ReportMetric(float64(passDecisions)/float64(b.N), "decisions/pass")
	b.ReportMetric(float64(setup+passDecisions)/float64(waiting), "decisions/run")
	b.ReportMetric(float64(s.planTime.Nanoseconds())/float64(b.N), "ns/pass")
	b.ReportMetric(float64(floorNanos(s, 500))*waiting/500, "floor-ns/pass")
	b.ReportMetric(waiting, "floor-decisions/pass")
}

// floorNanos times one decision for each of the first sample waiting Runs
// on the sim's fleet: the old rule's cost per Run.
func floorNanos(s *sim, sample int) int64 {
	f := s.fleet()
	start := time.Now()
	for _, r := range s.sorted() {
		if sample == 0 {
			break
		}
		if r.Phase == schemas.PhaseAccepted {
			placement.Decide(placement.Request{RunID: r.ID, Attempt: 1, Run: r.Request, Digest: digest}, f, s.now, s.cfg)
			sample--
		}
	}
	return time.Since(start).Nanoseconds()
}
