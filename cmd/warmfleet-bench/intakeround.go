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

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/schemas"
)

// intakeOnce is one round at one producer count, on a fresh server and
// control plane: the raw baseline, the floor, intake, and (--idle) what
// the waiting Runs cost afterwards.
func intakeOnce(ctx context.Context, g *globals, o intakeOpts, enc codec.Encoding, producers int, prof *profiler) (intakeRound, error) {
	res := intakeRound{Producers: producers}
	e, err := startEnv(g, "intake", controlplane.Config{WaitForCapacity: true})
	if err != nil {
		return res, err
	}
	defer e.close()
	in, err := newIntakeBench(e, enc)
	if err != nil {
		return res, err
	}
	res.PayloadBytes = len(in.sample.Data)
	if res.BaselineRate, err = in.baseline(ctx, producers, o.duration); err != nil {
		return res, fmt.Errorf("baseline: %w", err)
	}
	if res.FloorRate, err = intakeFloor(ctx, e, producers, o.duration, in.sample.Data, enc, in.nonce); err != nil {
		return res, err
	}
	sub, err := in.submit(ctx, producers, o, prof)
	if err != nil {
		return res, err
	}
	rec, err := in.readBack(ctx, sub, o.drain)
	if err != nil {
		return res, err
	}
	if err := in.record(ctx, &res, sub, rec); err != nil {
		return res, err
	}
	if o.idle > 0 {
		err = in.idleCost(ctx, &res, o.idle)
	}
	return res, err
}

// intakeBench is one round's world: NATS with a control plane that
// waits for capacity (no node enrolls), the producers' connection, and the
// sample submit every producer splices its request ids into.
type intakeBench struct {
	e         *env
	prod      *bus.Conn
	enc       codec.Encoding
	nonce     string
	sample    *nats.Msg
	sampleRID string
}

func newIntakeBench(e *env, enc codec.Encoding) (*intakeBench, error) {
	prod, err := e.connect("producer")
	if err != nil {
		return nil, err
	}
	in := &intakeBench{e: e, prod: prod, enc: enc, nonce: strconv.FormatInt(time.Now().UnixNano(), 36)}
	in.sampleRID = benchRID(in.nonce, 0, 0)
	in.sample, err = submitMsg(runRequest(in.sampleRID, "localhost/bench@"+benchDigest("intake")), enc)
	return in, err
}

// baseline is the same producers publishing the same bytes to a plain
// work-queue file stream with the same dedupe window.
func (in *intakeBench) baseline(ctx context.Context, producers int, d time.Duration) (float64, error) {
	if _, err := in.prod.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: bus.DedupeWindow}); err != nil {
		return 0, err
	}
	n, elapsed, err := publishFor(ctx, producers, d, func(p, i int) *nats.Msg {
		return in.msg("bench.raw", in.sample.Data, fmt.Sprintf("raw-%s-%02d-%07d", in.nonce, p, i))
	}, in.prod.JS)
	if err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), in.prod.JS.DeleteStream(ctx, "BENCH_RAW")
}

// msg is a producer's message: body with the encoding's Content-Type and
// id as its Nats-Msg-Id.
func (in *intakeBench) msg(subject string, body []byte, id string) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, in.enc.ContentType())
	m.Header.Set(jetstream.MsgIDHeader, id)
	return m
}

// submitted is the intake phase: what the producers sent, and when.
type submitted struct {
	from       uint64 // WF_EVENTS sequence the phase's events start at
	start      time.Time
	n          int64
	elapsed    time.Duration
	sentAt     [][]time.Time // [producer][i], each written by its own producer
	published0 int64         // the control plane's event publishes before
	cores      float64       // this process, publish through drain
	drainErr   error         // errDrain: not every event stored in --drain-timeout
}

// submit runs the producers for --duration and waits (--drain-timeout) for
// the control plane to store an event per submit. Nothing watches the
// events meanwhile: they are read back afterwards, each with the time the
// server stored it.
func (in *intakeBench) submit(ctx context.Context, producers int, o intakeOpts, prof *profiler) (submitted, error) {
	sub := submitted{sentAt: make([][]time.Time, producers)}
	tmpl, err := newSubmitTemplate(in.sample.Data, in.sampleRID)
	if err != nil {
		return sub, err
	}
	if sub.from, err = eventsFrom(ctx, in.prod.JS); err != nil {
		return sub, err
	}
	sub.published0 = in.e.cp.Metrics().EventsPublished
	if prof != nil {
		if err := prof.start(); err != nil {
			return sub, err
		}
	}
	meter, err := startMeter(os.Getpid())
	if err != nil {
		return sub, err
	}
	sub.start = time.Now()
	sub.n, sub.elapsed, err = publishFor(ctx, producers, o.duration, func(p, i int) *nats.Msg {
		rid := benchRID(in.nonce, p, i)
		m := in.msg(bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), tmpl.body(rid), rid)
		sub.sentAt[p] = append(sub.sentAt[p], time.Now())
		return m
	}, in.prod.JS)
	if err != nil {
		return sub, fmt.Errorf("submit: %w", err)
	}
	// Every Run here gets its accepted event and its first decision, in
	// one event (decided at intake) or two (decided by the scheduler).
	sub.drainErr = waitEvents(ctx, in.prod.JS, sub.from+uint64(sub.n), time.Now().Add(o.drain))
	sub.cores, _ = meter.cores()
	if prof != nil {
		prof.stop()
	}
	if sub.drainErr != nil && !errors.Is(sub.drainErr, errDrain) {
		return sub, sub.drainErr
	}
	return sub, nil
}

// recorded is what WF_EVENTS holds of the intake phase: each Run's
// accepted event's store time, which Runs have their first decision
// stored, the last of each, and how many events were stored.
type recorded struct {
	accepted                  map[string]time.Time
	decided                   map[string]bool
	lastAccepted, lastDecided time.Time
	stored                    int
}

// readBack reads the phase's events until every Run's first decision is
// stored, waiting up to drain for the scheduler's decisions still to come.
func (in *intakeBench) readBack(ctx context.Context, sub submitted, drain time.Duration) (recorded, error) {
	drainErr := sub.drainErr
	for deadline := time.Now().Add(drain); ; {
		evs, err := readEvents(ctx, in.prod.JS, sub.from)
		if err != nil {
			return recorded{}, err
		}
		rec := recorded{stored: len(evs), accepted: map[string]time.Time{}, decided: map[string]bool{}}
		for _, ev := range evs {
			if _, ok := rec.accepted[ev.runID]; !ok && ev.typ == string(schemas.EventAccepted) {
				rec.accepted[ev.runID] = ev.at
				rec.lastAccepted = later(rec.lastAccepted, ev.at)
			}
			if ev.decided && !rec.decided[ev.runID] {
				rec.decided[ev.runID] = true
				rec.lastDecided = later(rec.lastDecided, ev.at)
			}
		}
		if drainErr != nil {
			return rec, fmt.Errorf("%d of %d Runs recorded and %d decided %s after producers stopped", len(rec.accepted), sub.n, len(rec.decided), drain)
		}
		if len(rec.decided) >= int(sub.n) {
			return rec, nil
		}
		// Decisions still to come from the scheduler: one event each.
		next := sub.from + uint64(len(evs)) + uint64(int(sub.n)-len(rec.decided))
		if drainErr = waitEvents(ctx, in.prod.JS, next, deadline); drainErr != nil && !errors.Is(drainErr, errDrain) {
			return rec, drainErr
		}
	}
}

// record fills the round's rates and latencies from what was stored, and
// cross-checks the durable record: one wf_runs key per Run.
func (in *intakeBench) record(ctx context.Context, res *intakeRound, sub submitted, rec recorded) error {
	res.Submitted = int(sub.n)
	res.SubmitRate = float64(sub.n) / sub.elapsed.Seconds()
	res.IntakeCores = sub.cores
	res.Recorded = len(rec.accepted)
	res.RecordedRate = float64(res.Recorded) / rec.lastAccepted.Sub(sub.start).Seconds()
	res.DrainSeconds = max(0, rec.lastAccepted.Sub(sub.start.Add(sub.elapsed)).Seconds())
	res.SchedulerLagS = max(0, rec.lastDecided.Sub(rec.lastAccepted).Seconds())
	res.DecidedRate = float64(res.Recorded) / later(rec.lastDecided, rec.lastAccepted).Sub(sub.start).Seconds()
	lat := make([]time.Duration, 0, len(rec.accepted))
	for p, times := range sub.sentAt {
		for i, t := range times {
			if at, ok := rec.accepted[schemas.RunIDFor(schemas.DefaultTenant, benchRID(in.nonce, p, i))]; ok {
				lat = append(lat, at.Sub(t))
			}
		}
	}
	res.Latency = summarise(lat)
	if s, err := in.prod.JS.Stream(ctx, "KV_"+bus.BucketRuns); err == nil {
		if info, err := s.Info(ctx); err == nil {
			res.InWFRuns = info.State.NumSubjects
		}
	}
	if res.InWFRuns < uint64(res.Submitted) {
		return fmt.Errorf("wf_runs holds %d Runs, %d were submitted", res.InWFRuns, res.Submitted)
	}
	m := in.e.cp.Metrics()
	res.DecidedAtIntake = m.DecidedAtIntake
	res.EventPublishes = m.EventsPublished - sub.published0
	res.EventsStored = uint64(rec.stored)
	return nil
}

// idleCost is what the waiting Runs cost with no traffic at all, over d.
func (in *intakeBench) idleCost(ctx context.Context, res *intakeRound, d time.Duration) error {
	idleFrom, err := eventsFrom(ctx, in.prod.JS)
	if err != nil {
		return err
	}
	idle, err := startMeter(os.Getpid())
	if err != nil {
		return err
	}
	pub0 := in.e.cp.Metrics().EventsPublished
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return ctx.Err()
	}
	res.IdleCores, _ = idle.cores()
	res.IdlePublishesPerS = float64(in.e.cp.Metrics().EventsPublished-pub0) / d.Seconds()
	idleEvs, err := readEvents(ctx, in.prod.JS, idleFrom)
	if err != nil {
		return err
	}
	res.IdleEventTypes = map[string]int64{}
	for _, ev := range idleEvs {
		res.IdleEventTypes[ev.typ]++
	}
	return nil
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
