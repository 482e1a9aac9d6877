package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

type intakeOpts struct {
	producers []int
	duration  time.Duration
	drain     time.Duration
	rounds    int
	encoding  string
	idle      time.Duration
}

func newIntakeCmd(g *globals) *cobra.Command {
	o := intakeOpts{}
	cmd := &cobra.Command{
		Use:   "intake",
		Short: "Runs accepted and durably recorded per second vs raw JetStream publish-with-ack",
		Long: `intake measures how many Runs per second the control plane accepts and durably
records: the submit is in WF_RUNS, the Run is in wf_runs, and its accepted
event is in WF_EVENTS. Producers publish submits with publish-with-ack, one
in flight each, for --duration; a Run counts as recorded at the time the
server stored its accepted event. The rate is Runs / (first submit → last
accepted event), so a backlog the control plane is still draining when
producers stop counts against it. Nothing watches the events while
producers run: they are read back from WF_EVENTS afterwards.

The baseline is the same number of producers publishing the same payload
size, with the same headers and Nats-Msg-Id, to a plain work-queue file
stream on the same server, measured just before. Both publish a body
encoded once: intake's producers splice each request id into it. No node
is enrolled, so every Run waits in accepted, its accepted event carrying
the first decision (no capacity) that intake stored with it. Each round
starts a fresh server and control plane.`,
		RunE: g.reporting(func(ctx context.Context) (*Report, error) { return runIntake(ctx, g, o) }),
	}
	f := cmd.Flags()
	f.IntSliceVar(&o.producers, "producers", []int{1, 4, 16}, "concurrent producers, one measurement each")
	f.DurationVar(&o.duration, "duration", 3*time.Second, "how long producers publish, per measurement")
	f.DurationVar(&o.drain, "drain-timeout", 60*time.Second, "how long to wait for the control plane to record every submit and store its first decision")
	f.IntVar(&o.rounds, "rounds", 1, "rounds per producer count; the median is reported")
	f.StringVar(&o.encoding, "encoding", "json", "submit encoding: json (as the CLI sends) or msgpack")
	f.DurationVar(&o.idle, "idle", 3*time.Second, "after the drain, how long to measure what the waiting Runs cost with no traffic (0 skips)")
	return cmd
}

// intakeRound is one measurement at one producer count.
type intakeRound struct {
	Producers    int     `json:"producers"`
	BaselineRate float64 `json:"baseline_msgs_per_s"`
	// FloorRate is intakeFloor's rate: the three writes with no logic.
	FloorRate    float64   `json:"floor_runs_per_s"`
	SubmitRate   float64   `json:"submit_acks_per_s"`
	RecordedRate float64   `json:"recorded_runs_per_s"`
	Submitted    int       `json:"submitted"`
	Recorded     int       `json:"recorded"`
	InWFRuns     uint64    `json:"runs_in_wf_runs"`
	DrainSeconds float64   `json:"drain_s"`
	Latency      Latencies `json:"submit_to_accepted"`
	PayloadBytes int       `json:"payload_bytes"`
	// EventPublishes is the control plane's count of event publishes
	// (republished outboxes included); EventsStored is what WF_EVENTS kept
	// after Nats-Msg-Id dedupe.
	EventPublishes int64  `json:"event_publishes"`
	EventsStored   uint64 `json:"events_stored"`
	// Idle: with every Run recorded and no traffic, the process's CPU and
	// the event publishes per second that the waiting Runs cause.
	IdleCores         float64 `json:"idle_cores,omitempty"`
	IdlePublishesPerS float64 `json:"idle_event_publishes_per_s,omitempty"`
	IntakeCores       float64 `json:"process_cores_during_intake"`
	// DecidedAtIntake is how many Runs were stored with their first
	// decision, leaving the scheduler no write to make.
	DecidedAtIntake int64 `json:"decided_at_intake"`
	// SchedulerLagS is how long after the last accepted event the scheduler
	// took to record every Run's first decision.
	SchedulerLagS float64 `json:"scheduler_lag_s"`
	// DecidedRate counts a Run only once its first decision is stored too:
	// Runs / (first submit → last accepted event + scheduler lag). It is
	// what a sustained load gets, since decisions left behind pile up.
	DecidedRate float64 `json:"decided_runs_per_s"`
	// IdleEventTypes counts the events stored in the idle window, by type.
	IdleEventTypes map[string]int64 `json:"idle_event_types,omitempty"`
}

func runIntake(ctx context.Context, g *globals, o intakeOpts) (*Report, error) {
	enc, err := parseEncoding(o.encoding)
	if err != nil {
		return nil, err
	}
	for _, p := range o.producers {
		if p < 1 || p > 99 {
			return nil, fmt.Errorf("--producers %d: use 1 to 99 (request ids carry a two-digit producer number)", p)
		}
	}
	prof, err := newProfiler(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	defer prof.close()
	rep := newReport("intake")
	var all []intakeRound
	for pi, p := range o.producers {
		var rounds []intakeRound
		for r := range o.rounds {
			var pr *profiler
			if pi == len(o.producers)-1 && r == o.rounds-1 {
				pr = prof // profile the intake phase of the last measurement only
			}
			res, err := intakeOnce(ctx, g, o, enc, p, pr)
			if err != nil {
				return nil, fmt.Errorf("intake with %d producers: %w", p, err)
			}
			rounds = append(rounds, res)
			all = append(all, res)
		}
		reportProducers(rep, o, p, rounds)
	}
	rep.Details["rounds"] = all
	rep.note("recorded = the Run's accepted event is in WF_EVENTS (after the wf_runs Create), timed by the server's store stamp; rate = Runs / (first submit → last accepted event), drain included")
	rep.note("events are read back after the window, not watched during it; producers splice each request id into one encoded body, as the baseline publishes one body")
	rep.note("intake vs its floor: the ratio is the median of each round's intake / floor, so it may differ from the two medians shown")
	rep.note("with first decision stored = Runs / (first submit → last accepted event + the time until every Run's first decision is stored): the rate a sustained load gets")
	rep.note("floor = the same producers into a work-queue stream, and a 64-worker consumer doing only KV Create + one event publish-with-ack + ack per message: the ceiling for these three writes on this server")
	rep.note("submit → accepted grows with the backlog: producers outrun the control plane, so it is queueing delay, not service time")
	rep.note("encoding %s; one fresh embedded NATS + control plane per round; %d round(s) per row, median shown", o.encoding, o.rounds)
	return rep, nil
}

// reportProducers adds the rows of p producers' rounds: medians over them.
func reportProducers(rep *Report, o intakeOpts, p int, rounds []intakeRound) {
	rec, base, lat, floor, decided := make([]float64, 0), make([]float64, 0), make([]float64, 0), make([]float64, 0), make([]float64, 0)
	for _, x := range rounds {
		rec, base, lat = append(rec, x.RecordedRate), append(base, x.BaselineRate), append(lat, x.Latency.P50)
		floor, decided = append(floor, x.FloorRate), append(decided, x.DecidedRate)
	}
	recRate, baseRate := median(rec), median(base)
	row := rep.add(fmt.Sprintf("intake, %d producer(s)", p), recRate, "Runs/s", baseRate, "raw JetStream publish-with-ack")
	row.unitOfBaseline("msgs/s")
	row.goal("≥ 5000 Runs/s and ≥ 30% of baseline", recRate >= 5000 && recRate >= 0.3*baseRate)
	// Each round's intake and floor run seconds apart; the ratio is the
	// median of the rounds' own ratios, not of two medians from different
	// rounds.
	perRound := make([]float64, 0, len(rounds))
	for _, x := range rounds {
		perRound = append(perRound, x.RecordedRate/x.FloorRate)
	}
	fr := rep.add(fmt.Sprintf("intake vs its floor, %d producer(s)", p), recRate, "Runs/s", median(floor), "floor: the 3 writes with no logic").unitOfBaseline("Runs/s")
	fr.Ratio = median(perRound)
	if p >= 4 {
		fr.goal("≥ 0.8 of its floor", fr.Ratio >= 0.8)
	}
	rep.add(fmt.Sprintf("floor vs raw publish, %d producer(s)", p), median(floor), "Runs/s", baseRate, "raw JetStream publish-with-ack").unitOfBaseline("msgs/s")
	rep.add(fmt.Sprintf("intake with first decision stored, %d producer(s)", p), median(decided), "Runs/s", baseRate, "raw JetStream publish-with-ack").unitOfBaseline("msgs/s")
	rep.add(fmt.Sprintf("submit → accepted p50, %d producer(s)", p), median(lat), "ms", 0, "")
	last := rounds[len(rounds)-1]
	rep.add(fmt.Sprintf("event publishes per stored event, %d producer(s)", p), float64(last.EventPublishes)/float64(max(last.EventsStored, 1)), "×", 0, "")
	if o.idle > 0 {
		rep.add(fmt.Sprintf("idle CPU with %d Runs waiting", last.Submitted), last.IdleCores, "cores", 0, "")
		rep.add(fmt.Sprintf("idle event republishes with %d Runs waiting", last.Submitted), last.IdlePublishesPerS, "/s", 0, "")
	}
}
