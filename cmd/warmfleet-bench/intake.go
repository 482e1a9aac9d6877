package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := runIntake(cmd.Context(), g, o)
			if err != nil {
				return err
			}
			return rep.print(cmd.OutOrStdout(), g.output)
		},
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
		// median of the rounds' own ratios, not of two medians from
		// different rounds.
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

func intakeOnce(ctx context.Context, g *globals, o intakeOpts, enc codec.Encoding, producers int, prof *profiler) (intakeRound, error) {
	res := intakeRound{Producers: producers}
	e, err := newEnv(g, "intake")
	if err != nil {
		return res, err
	}
	defer e.close()
	if err := e.startCP(controlplane.Config{WaitForCapacity: true}); err != nil {
		return res, err
	}
	prod, err := e.connect("producer")
	if err != nil {
		return res, err
	}
	image := "localhost/bench@" + benchDigest("intake")
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	sampleRID := benchRID(nonce, 0, 0)
	sample, err := submitMsg(runRequest(sampleRID, image), enc)
	if err != nil {
		return res, err
	}
	res.PayloadBytes = len(sample.Data)

	// Baseline: the same producers publishing the same bytes to a plain
	// work-queue file stream with the same dedupe window.
	if _, err := prod.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return res, err
	}
	n, elapsed, err := publishFor(ctx, producers, o.duration, func(p, i int) *nats.Msg {
		m := &nats.Msg{Subject: "bench.raw", Data: sample.Data, Header: nats.Header{}}
		m.Header.Set(codec.ContentTypeHeader, enc.ContentType())
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("raw-%s-%02d-%07d", nonce, p, i))
		return m
	}, prod.JS)
	if err != nil {
		return res, fmt.Errorf("baseline: %w", err)
	}
	res.BaselineRate = float64(n) / elapsed.Seconds()
	if err := prod.JS.DeleteStream(ctx, "BENCH_RAW"); err != nil {
		return res, err
	}
	if res.FloorRate, err = intakeFloor(ctx, e, producers, o.duration, sample.Data, enc, nonce); err != nil {
		return res, err
	}

	// Intake. Nothing watches the events while producers run: they are read
	// back afterwards, each with the time the server stored it.
	tmpl, err := newSubmitTemplate(sample.Data, sampleRID)
	if err != nil {
		return res, err
	}
	from, err := eventsFrom(ctx, prod.JS)
	if err != nil {
		return res, err
	}
	published0 := e.cp.Metrics().EventsPublished
	sentAt := make([][]time.Time, producers) // [producer][i], each written by its own producer
	if prof != nil {
		if err := prof.start(); err != nil {
			return res, err
		}
	}
	meter, err := startMeter(os.Getpid())
	if err != nil {
		return res, err
	}
	start := time.Now()
	n, elapsed, err = publishFor(ctx, producers, o.duration, func(p, i int) *nats.Msg {
		rid := benchRID(nonce, p, i)
		m := &nats.Msg{Subject: bus.SubjectSubmit, Data: tmpl.body(rid), Header: nats.Header{}}
		m.Header.Set(codec.ContentTypeHeader, enc.ContentType())
		m.Header.Set(jetstream.MsgIDHeader, rid)
		sentAt[p] = append(sentAt[p], time.Now())
		return m
	}, prod.JS)
	if err != nil {
		return res, fmt.Errorf("submit: %w", err)
	}
	windowEnd := start.Add(elapsed)
	res.Submitted = int(n)
	res.SubmitRate = float64(n) / elapsed.Seconds()
	// Every Run here gets its accepted event and its first decision, in
	// one event (decided at intake) or two (decided by the scheduler).
	drainErr := waitEvents(ctx, prod.JS, from+uint64(n), time.Now().Add(o.drain))
	res.IntakeCores, _ = meter.cores()
	if prof != nil {
		prof.stop()
	}
	if drainErr != nil && !errors.Is(drainErr, errDrain) {
		return res, drainErr
	}
	var (
		accepted                  map[string]time.Time
		decided                   map[string]bool
		lastAccepted, lastDecided time.Time
		stored                    int
	)
	for deadline := time.Now().Add(o.drain); ; {
		evs, err := readEvents(ctx, prod.JS, from)
		if err != nil {
			return res, err
		}
		stored = len(evs)
		accepted, decided = map[string]time.Time{}, map[string]bool{}
		lastAccepted, lastDecided = time.Time{}, time.Time{}
		for _, ev := range evs {
			if _, ok := accepted[ev.runID]; !ok && ev.typ == string(schemas.EventAccepted) {
				accepted[ev.runID] = ev.at
				lastAccepted = later(lastAccepted, ev.at)
			}
			if ev.decided && !decided[ev.runID] {
				decided[ev.runID] = true
				lastDecided = later(lastDecided, ev.at)
			}
		}
		if drainErr != nil || len(decided) >= int(n) {
			break
		}
		// Decisions still to come from the scheduler: one event each.
		next := from + uint64(len(evs)) + uint64(int(n)-len(decided))
		if drainErr = waitEvents(ctx, prod.JS, next, deadline); drainErr != nil && !errors.Is(drainErr, errDrain) {
			return res, drainErr
		}
	}
	if drainErr != nil {
		return res, fmt.Errorf("%d of %d Runs recorded and %d decided %s after producers stopped", len(accepted), n, len(decided), o.drain)
	}
	res.Recorded = len(accepted)
	res.RecordedRate = float64(res.Recorded) / lastAccepted.Sub(start).Seconds()
	res.DrainSeconds = max(0, lastAccepted.Sub(windowEnd).Seconds())
	res.SchedulerLagS = max(0, lastDecided.Sub(lastAccepted).Seconds())
	res.DecidedRate = float64(res.Recorded) / later(lastDecided, lastAccepted).Sub(start).Seconds()
	lat := make([]time.Duration, 0, len(accepted))
	for p, times := range sentAt {
		for i, t := range times {
			if at, ok := accepted[schemas.RunIDFor(benchRID(nonce, p, i))]; ok {
				lat = append(lat, at.Sub(t))
			}
		}
	}
	res.Latency = summarise(lat)
	// Cross-check the durable record: one wf_runs key per Run.
	if s, err := prod.JS.Stream(ctx, "KV_"+bus.BucketRuns); err == nil {
		if info, err := s.Info(ctx); err == nil {
			res.InWFRuns = info.State.NumSubjects
		}
	}
	if res.InWFRuns < uint64(res.Submitted) {
		return res, fmt.Errorf("wf_runs holds %d Runs, %d were submitted", res.InWFRuns, res.Submitted)
	}
	res.DecidedAtIntake = e.cp.Metrics().DecidedAtIntake
	res.EventPublishes = e.cp.Metrics().EventsPublished - published0
	res.EventsStored = uint64(stored)
	if o.idle > 0 {
		// What the waiting Runs cost with no traffic at all.
		idleFrom, err := eventsFrom(ctx, prod.JS)
		if err != nil {
			return res, err
		}
		idle, err := startMeter(os.Getpid())
		if err != nil {
			return res, err
		}
		pub0 := e.cp.Metrics().EventsPublished
		select {
		case <-time.After(o.idle):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		res.IdleCores, _ = idle.cores()
		res.IdlePublishesPerS = float64(e.cp.Metrics().EventsPublished-pub0) / o.idle.Seconds()
		idleEvs, err := readEvents(ctx, prod.JS, idleFrom)
		if err != nil {
			return res, err
		}
		res.IdleEventTypes = map[string]int64{}
		for _, ev := range idleEvs {
			res.IdleEventTypes[ev.typ]++
		}
	}
	return res, nil
}

// benchRID is producer p's i-th request id; every one is as long as the
// sample's, so it splices into the submit template.
func benchRID(nonce string, p, i int) string { return fmt.Sprintf("bench-%s-%02d-%09d", nonce, p, i) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// publishFor runs producers goroutines that each publish with ack, one in
// flight, until d has passed. It returns the acked count and the window.
func publishFor(ctx context.Context, producers int, d time.Duration, msg func(p, i int) *nats.Msg, js jetstream.JetStream) (int64, time.Duration, error) {
	var (
		count   atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		firstEr error
	)
	start := time.Now()
	stop := start.Add(d)
	for p := range producers {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop) && ctx.Err() == nil; i++ {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := js.PublishMsg(pctx, msg(p, i))
				cancel()
				if err != nil {
					errOnce.Do(func() { firstEr = err })
					return
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	return count.Load(), time.Since(start), firstEr
}
