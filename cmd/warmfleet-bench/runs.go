package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// submitRun publishes req as `warmfleet run submit` does (JSON, its
// request id the Nats-Msg-Id) and returns when it was published and the
// Run's id.
func submitRun(ctx context.Context, js jetstream.JetStream, req schemas.RunRequest) (time.Time, string, error) {
	m, err := submitMsg(req, codec.JSON)
	if err != nil {
		return time.Time{}, "", err
	}
	t0 := time.Now()
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(req.RequestID)); err != nil {
		return t0, "", err
	}
	return t0, schemas.RunIDFor(schemas.DefaultTenant, req.RequestID), nil
}

// runEnd is one Run followed to its end: its phases' event times, when
// this process saw each, its accepted event's time, and when it was
// submitted.
type runEnd struct {
	submitted, accepted time.Time
	phases, seen        map[schemas.Phase]time.Time
}

// succeeded fails unless the Run succeeded; logPath is where to look.
func (r runEnd) succeeded(rid, logPath string) error {
	if _, ok := r.phases[schemas.PhaseSucceeded]; !ok {
		return fmt.Errorf("run %s did not succeed (phases %v); see %s", rid, keys(r.phases), logPath)
	}
	return nil
}

// runWatch follows every Run's events on a core subscription.
type runWatch struct {
	mu     sync.Mutex
	phases map[string]map[schemas.Phase]time.Time // run → phase → event At
	seen   map[string]map[schemas.Phase]time.Time // run → phase → when this process saw it
	accAt  map[string]time.Time
	cond   chan struct{}
	sub    *nats.Subscription
}

func watchRuns(nc *nats.Conn) (*runWatch, error) {
	w := &runWatch{phases: map[string]map[schemas.Phase]time.Time{}, seen: map[string]map[schemas.Phase]time.Time{},
		accAt: map[string]time.Time{}, cond: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(bus.SubjectEvents, w.record)
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	w.sub = sub
	return w, nc.Flush()
}

// record notes the first accepted event and each phase's first event.
func (w *runWatch) record(m *nats.Msg) {
	now := time.Now()
	var ev schemas.RunEvent
	if json.Unmarshal(m.Data, &ev) != nil {
		return
	}
	w.mu.Lock()
	switch ev.Type {
	case schemas.EventAccepted:
		if _, ok := w.accAt[ev.RunID]; !ok {
			w.accAt[ev.RunID] = ev.At
		}
	case schemas.EventPhase:
		if w.phases[ev.RunID] == nil {
			w.phases[ev.RunID], w.seen[ev.RunID] = map[schemas.Phase]time.Time{}, map[schemas.Phase]time.Time{}
		}
		if _, ok := w.phases[ev.RunID][ev.Phase]; !ok {
			w.phases[ev.RunID][ev.Phase], w.seen[ev.RunID][ev.Phase] = ev.At, now
		}
	}
	w.mu.Unlock()
	select {
	case w.cond <- struct{}{}:
	default:
	}
}

func (w *runWatch) stop() { _ = w.sub.Unsubscribe() }

// run submits req and follows the Run until it ends, at most within.
func (w *runWatch) run(ctx context.Context, js jetstream.JetStream, req schemas.RunRequest, within time.Duration) (runEnd, error) {
	t0, runID, err := submitRun(ctx, js, req)
	if err != nil {
		return runEnd{}, err
	}
	end, err := w.waitTerminal(ctx, runID, within)
	end.submitted = t0
	return end, err
}

// waitTerminal waits until the Run reaches a terminal phase, and returns
// its phase times (event At) and when each was seen here.
func (w *runWatch) waitTerminal(ctx context.Context, runID string, within time.Duration) (runEnd, error) {
	deadline := time.After(within)
	for {
		w.mu.Lock()
		end, done := runEnd{phases: w.phases[runID], seen: w.seen[runID], accepted: w.accAt[runID]}, w.terminalLocked(runID)
		w.mu.Unlock()
		if done {
			return end, nil
		}
		select {
		case <-w.cond:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return runEnd{}, fmt.Errorf("run %s not terminal after %s (phases %v)", runID, within, keys(end.phases))
		case <-ctx.Done():
			return runEnd{}, ctx.Err()
		}
	}
}

// terminal says whether the Run has reached a terminal phase.
func (w *runWatch) terminal(runID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.terminalLocked(runID)
}

func (w *runWatch) terminalLocked(runID string) bool {
	for p := range w.phases[runID] {
		if p.Terminal() {
			return true
		}
	}
	return false
}

// waitPhase waits until the Run has reached phase p (or ended).
func (w *runWatch) waitPhase(ctx context.Context, runID string, p schemas.Phase, within time.Duration) error {
	deadline := time.After(within)
	for {
		w.mu.Lock()
		_, ok := w.phases[runID][p]
		w.mu.Unlock()
		if ok {
			return nil
		}
		if w.terminal(runID) {
			return fmt.Errorf("run %s ended before %s", runID, p)
		}
		select {
		case <-w.cond:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("run %s not %s after %s", runID, p, within)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func keys(m map[schemas.Phase]time.Time) []string {
	var out []string
	for k := range m {
		out = append(out, string(k))
	}
	return out
}

// runTimings are whole Runs timed from their events.
type runTimings struct {
	submitToRunning []time.Duration // wall clock: publish → running event seen
	placedToRunning []time.Duration // event At: placed → running
	byStage         map[string][]time.Duration
}

func newRunTimings() *runTimings { return &runTimings{byStage: map[string][]time.Duration{}} }

var stageOrder = []string{"submit→accepted", "accepted→placed", "placed→preparing", "preparing→launching", "launching→running", "submit→running"}

func (r *runTimings) stages() map[string]Latencies {
	out := map[string]Latencies{}
	for k, v := range r.byStage {
		out[k] = summarise(v)
	}
	return out
}

// submitToRunning submits n Runs one after another, each once the last
// ended, and times their phases.
func submitToRunning(ctx context.Context, client *bus.Conn, image string, n int, within time.Duration) (*runTimings, error) {
	w, err := watchRuns(client.NC)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	out := newRunTimings()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range n {
		end, err := w.run(ctx, client.JS, runRequest(fmt.Sprintf("bench-run-%s-%04d", nonce, i), image), within)
		if err != nil {
			return nil, err
		}
		out.add(end)
	}
	return out, nil
}

func (r *runTimings) add(end runEnd) {
	submitted, accepted, ph, seen := end.submitted, end.accepted, end.phases, end.seen
	running, ok := ph[schemas.PhaseRunning]
	if !ok {
		return // went straight to a terminal phase; not a sample
	}
	r.submitToRunning = append(r.submitToRunning, seen[schemas.PhaseRunning].Sub(submitted))
	r.byStage["submit→running"] = append(r.byStage["submit→running"], seen[schemas.PhaseRunning].Sub(submitted))
	if p, ok := ph[schemas.PhasePlaced]; ok {
		r.placedToRunning = append(r.placedToRunning, running.Sub(p))
	}
	if !accepted.IsZero() {
		r.byStage["submit→accepted"] = append(r.byStage["submit→accepted"], accepted.Sub(submitted))
	}
	// Stages between consecutive phases the Run passed through; a skipped
	// phase folds into the next stage.
	prevName, prev := "accepted", accepted
	for _, p := range []schemas.Phase{schemas.PhasePlaced, schemas.PhasePreparing, schemas.PhaseLaunching, schemas.PhaseRunning} {
		at, ok := ph[p]
		if !ok {
			continue
		}
		if !prev.IsZero() {
			k := prevName + "→" + string(p)
			r.byStage[k] = append(r.byStage[k], at.Sub(prev))
		}
		prevName, prev = string(p), at
	}
}

// stageTable renders stages in lifecycle order for a note.
func stageTable(st map[string]Latencies) string {
	var parts []string
	for _, k := range stageOrder {
		if l, ok := st[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f ms", k, l.P50))
		}
	}
	return strings.Join(parts, ", ")
}
