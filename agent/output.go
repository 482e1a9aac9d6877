package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/nodelog"
)

// An attempt's output lives in <DataDir>/output/<attempt id> (package
// nodelog's layout), written by the runtime's log writer and shipped from
// there to WF_LOGS by a shipment. The directory is kept until JetStream has
// acknowledged every byte and the attempt's exit is reported; only then is
// it removed. A restarted agent ships every directory it finds, from what
// its journal says was acknowledged.

// Defaults for Config's output fields.
const (
	DefaultLogRate  = 1 << 20 // bytes per second, per Run
	DefaultLogBurst = 8 << 20
	// DefaultLogPoll is how often a running attempt's files are read.
	DefaultLogPoll = 100 * time.Millisecond
	// DefaultLogShipTimeout bounds how long an exit report waits for the
	// attempt's output to be stored (NATS down, a log login refused).
	DefaultLogShipTimeout = 2 * time.Minute
	// logWindow is how many chunks of one attempt are in flight at once.
	logWindow = 16
)

// LogDialer opens the connection one Run's output is shipped on and returns
// it with its closer. With NATS auth on, cmd/warmfleet-agent dials a login
// that may publish only that Run's log subject; nil ships on the agent's
// own connection.
type LogDialer func(ctx context.Context, runID string) (jetstream.JetStream, func(), error)

// outputMeta names whose output a directory holds; it is written before the
// workload is launched, so a directory always says where it ships.
type outputMeta struct {
	// RunID is the Run of an attempt's output; empty for a session's.
	RunID string `json:"run_id,omitempty"`
	// AttemptID is the workload id (the Wf-Attempt header).
	AttemptID string `json:"attempt_id"`
	Subject   string `json:"subject"`
}

const outputMetaFile = "meta.json"

func (a *Agent) outputRoot() string { return outputRoot(a.cfg.DataDir) }

func outputRoot(dataDir string) string { return filepath.Join(dataDir, "output") }

func (a *Agent) outputDir(attemptID string) string { return filepath.Join(a.outputRoot(), attemptID) }

func (a *Agent) prepareOutput(runID, attemptID string) (string, error) {
	return PrepareOutput(a.cfg.DataDir, runID, attemptID)
}

// PrepareOutput creates the output directory of a Run's attempt under an
// agent's data dir, with what it needs to be shipped, and returns it. An
// agent starting on dataDir ships every such directory its runtime holds
// no workload for (the benchmark uses this to feed it output).
func PrepareOutput(dataDir, runID, attemptID string) (string, error) {
	return prepareOutput(dataDir, outputMeta{RunID: runID, AttemptID: attemptID, Subject: bus.RunLogs(runID)})
}

func prepareOutput(dataDir string, meta outputMeta) (string, error) {
	dir := filepath.Join(outputRoot(dataDir), meta.AttemptID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("agent: output dir: %w", err)
	}
	b, _ := json.Marshal(meta)
	tmp := filepath.Join(dir, outputMetaFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return "", fmt.Errorf("agent: output meta: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, outputMetaFile)); err != nil {
		return "", fmt.Errorf("agent: output meta: %w", err)
	}
	return dir, nil
}

func readOutputMeta(dir string) (outputMeta, error) {
	var m outputMeta
	b, err := os.ReadFile(filepath.Join(dir, outputMetaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Subject == "" || m.AttemptID == "" {
		return m, fmt.Errorf("agent: %s: not an output meta (%v)", dir, err)
	}
	return m, nil
}

// shipment ships one attempt's output directory until both streams are
// stored to their end.
type shipment struct {
	a    *Agent
	dir  string
	meta outputMeta
	// final is closed when the workload's output is complete (the runtime
	// finished it, or the workload is gone); the writer's done mark says
	// the same.
	final     chan struct{}
	finalOnce sync.Once
	done      chan struct{} // closed when run returns
	err       error         // why run returned; nil: everything is stored

	mu       sync.Mutex
	stored   bool // every byte and both ends are stored
	reported bool // the attempt's exit is reported and its workload removed
}

// shipOutput returns the attempt's shipment, starting it if none runs.
func (a *Agent) shipOutput(ctx context.Context, attemptID string) (*shipment, error) {
	dir := a.outputDir(attemptID)
	meta, err := readOutputMeta(dir)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if sh, ok := a.shipments[attemptID]; ok {
		return sh, nil
	}
	sh := &shipment{a: a, dir: dir, meta: meta, final: make(chan struct{}), done: make(chan struct{})}
	a.shipments[attemptID] = sh
	a.wg.Go(func() {
		defer func() {
			a.mu.Lock()
			delete(a.shipments, attemptID)
			a.mu.Unlock()
			close(sh.done)
		}()
		sh.err = sh.run(ctx)
		switch {
		case sh.err == nil:
			sh.settle(func() { sh.stored = true })
		case errors.Is(sh.err, errLogRefused):
			// Kept, this output could never leave the node.
			a.log.Error("attempt output dropped: this node may not ship it", zap.String("workload", attemptID), zap.Error(sh.err))
			sh.settle(func() { sh.stored = true })
		case ctx.Err() == nil:
			a.log.Warn("attempt output not shipped; kept for the next start", zap.String("workload", attemptID), zap.Error(sh.err))
		}
	})
	return sh, nil
}

// finish tells the shipment the output is complete.
func (sh *shipment) finish() { sh.finalOnce.Do(func() { close(sh.final) }) }

// settle records a fact and removes the directory once the output is
// stored and the exit reported, whichever comes last.
func (sh *shipment) settle(fact func()) {
	sh.mu.Lock()
	fact()
	gone := sh.stored && sh.reported
	sh.mu.Unlock()
	if gone {
		if err := os.RemoveAll(sh.dir); err != nil {
			sh.a.log.Warn("remove shipped output", zap.String("dir", sh.dir), zap.Error(err))
		}
	}
}

// reportedDone records that the attempt's exit is reported.
func (sh *shipment) reportedDone() { sh.settle(func() { sh.reported = true }) }

// inflight is one chunk sent and not yet acknowledged.
type inflight struct {
	span    nodelog.Span
	stream  nodelog.Stream
	at      time.Time
	dropped int64
	ack     jetstream.PubAckFuture
}

// run ships until both streams are stored to their end, ctx ends, or the
// log connection is refused for good.
func (sh *shipment) run(ctx context.Context) error {
	a := sh.a
	js, closeJS, err := sh.dial(ctx)
	if err != nil {
		return err
	}
	defer closeJS()
	j, state, err := nodelog.OpenJournal(sh.dir)
	if err != nil {
		return err
	}
	defer j.Close()
	var tails [2]*nodelog.Tail
	var resend [2][]nodelog.Span
	for _, s := range nodelog.Streams {
		tails[s] = nodelog.NewTail(sh.dir, s, state[s].Next)
		defer tails[s].Close()
		resend[s] = state[s].Unacked
	}
	var queue []inflight
	defer a.behind.forget(sh.meta.AttemptID)
	backoff := 250 * time.Millisecond
	for {
		// Once the writer is done (or gone) the files are whole: a last
		// line without its newline ships as it is, and streams close.
		final := nodelog.Done(sh.dir) || sh.closed()
		// Send: spans owed again first, then new chunks, up to the window.
		for _, s := range nodelog.Streams {
			for !state[s].Ended && len(queue) < logWindow {
				var c nodelog.Chunk
				if len(resend[s]) > 0 {
					c, err = tails[s].At(resend[s][0], nil)
					if err != nil {
						return err
					}
					resend[s] = resend[s][1:]
				} else {
					var ok bool
					c, ok, err = tails[s].Next(bus.MaxLogChunk, final, a.cfg.Now())
					if err != nil {
						return err
					}
					if !ok {
						break
					}
					if err := j.Intent(s, nodelog.Span{Start: c.Offset, End: c.End()}); err != nil {
						return err
					}
				}
				f, err := js.PublishMsgAsync(sh.chunkMsg(c), jetstream.WithMsgID(bus.LogMsgID(sh.meta.AttemptID, s.String(), c.Offset)))
				if err != nil {
					resend[s] = append([]nodelog.Span{{Start: c.Offset, End: c.End()}}, resend[s]...)
					break
				}
				queue = append(queue, inflight{span: nodelog.Span{Start: c.Offset, End: c.End()}, stream: s, at: c.At, dropped: c.Dropped, ack: f})
			}
		}
		// A full window means more may be ready: read again at once.
		busy := len(queue) == logWindow
		// Acknowledgements, in the order sent.
		failed := false
		for len(queue) > 0 {
			head := queue[0]
			select {
			case <-head.ack.Ok():
			case err := <-head.ack.Err():
				a.log.Debug("log chunk not stored; resending", zap.String("workload", sh.meta.AttemptID), zap.Error(err))
				failed = true
			case <-ctx.Done():
				return ctx.Err()
			}
			if failed {
				break
			}
			if err := j.Acked(head.stream, head.span.End); err != nil {
				return err
			}
			state[head.stream].Acked = head.span.End
			if m := a.cfg.LogMetrics; m != nil {
				m.Shipped(head.stream.String(), head.span.End-head.span.Start, head.dropped, a.cfg.Now().Sub(head.at))
			}
			queue = queue[1:]
		}
		if failed {
			// Everything after the failure goes again, in order; what was
			// stored after all is dropped by JetStream's dedupe.
			for i := len(queue) - 1; i >= 0; i-- {
				q := queue[i]
				resend[q.stream] = append([]nodelog.Span{q.span}, resend[q.stream]...)
			}
			queue = queue[:0]
			if !sleepCtx(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 250 * time.Millisecond
		// Close each stream once its writer is done and every byte is stored.
		ended := 0
		for _, s := range nodelog.Streams {
			if state[s].Ended {
				ended++
				continue
			}
			size, err := nodelog.Size(sh.dir, s)
			if err != nil {
				return err
			}
			a.behind.set(sh.meta.AttemptID, s, size-state[s].Acked)
			if !final || len(resend[s]) > 0 || state[s].Acked < size {
				continue
			}
			if err := sh.publishEnd(ctx, js, s, size); err != nil {
				a.log.Debug("log end not stored; retrying", zap.String("workload", sh.meta.AttemptID), zap.Error(err))
				continue
			}
			if err := j.Ended(s, size); err != nil {
				return err
			}
			state[s].Ended = true
			ended++
		}
		if ended == len(nodelog.Streams) {
			return nil
		}
		if busy {
			continue
		}
		wake := sh.final
		if final {
			wake = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-time.After(a.cfg.LogPoll):
		}
	}
}

func (sh *shipment) closed() bool {
	select {
	case <-sh.final:
		return true
	default:
		return false
	}
}

// errLogRefused: NATS keeps refusing the Run's log login, so this node may
// not ship its output (the Run's attempt is booked elsewhere now).
var errLogRefused = errors.New("the Run's log login is refused")

// logLoginTries is how many refused log logins in a row mean "for good":
// one refusal may be the control plane failing to check the login.
const logLoginTries = 6

// dial opens the log connection, retrying until it is granted or ctx ends.
func (sh *shipment) dial(ctx context.Context) (jetstream.JetStream, func(), error) {
	a := sh.a
	if a.cfg.LogDialer == nil || sh.meta.RunID == "" {
		// A session's output goes on the node's own login, which may
		// publish every session's log subject, as it reads every
		// session's inbox (bus.PermsNode).
		return a.conn.JS, func() {}, nil
	}
	refused := 0
	for wait := 250 * time.Millisecond; ; wait = min(wait*2, 10*time.Second) {
		js, closeJS, err := a.cfg.LogDialer(ctx, sh.meta.RunID)
		if err == nil {
			return js, closeJS, nil
		}
		if bus.IsAuthError(err) {
			if refused++; refused >= logLoginTries {
				return nil, nil, fmt.Errorf("%w: %w", errLogRefused, err)
			}
		}
		a.log.Warn("log connection not open; retrying", zap.String("run_id", sh.meta.RunID), zap.Error(err))
		if !sleepCtx(ctx, wait) {
			return nil, nil, ctx.Err()
		}
	}
}

func (sh *shipment) chunkMsg(c nodelog.Chunk) *nats.Msg {
	m := nats.NewMsg(sh.meta.Subject)
	m.Data = c.Data
	m.Header.Set(bus.HeaderLogAttempt, sh.meta.AttemptID)
	m.Header.Set(bus.HeaderLogStream, c.Stream.String())
	m.Header.Set(bus.HeaderLogOffset, strconv.FormatInt(c.Offset, 10))
	m.Header.Set(bus.HeaderLogNode, sh.a.cfg.NodeID)
	if !c.At.IsZero() {
		m.Header.Set(bus.HeaderLogTime, c.At.UTC().Format(time.RFC3339Nano))
	}
	return m
}

func (sh *shipment) publishEnd(ctx context.Context, js jetstream.JetStream, s nodelog.Stream, size int64) error {
	m := nats.NewMsg(sh.meta.Subject)
	m.Header.Set(bus.HeaderLogAttempt, sh.meta.AttemptID)
	m.Header.Set(bus.HeaderLogStream, s.String())
	m.Header.Set(bus.HeaderLogNode, sh.a.cfg.NodeID)
	m.Header.Set(bus.HeaderLogEnd, strconv.FormatInt(size, 10))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(bus.LogEndMsgID(sh.meta.AttemptID, s.String())))
	return err
}

// shipLeftovers ships every output directory whose workload the runtime no
// longer holds (the agent died after removing it, before the last byte was
// stored); each is removed once stored.
func (a *Agent) shipLeftovers(ctx context.Context, held map[string]bool) {
	entries, err := os.ReadDir(a.outputRoot())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("list output dirs", zap.Error(err))
	}
	for _, e := range entries {
		if !e.IsDir() || held[e.Name()] {
			continue
		}
		sh, err := a.shipOutput(ctx, e.Name())
		if err != nil {
			a.log.Warn("output dir without its meta; left in place", zap.String("dir", a.outputDir(e.Name())), zap.Error(err))
			continue
		}
		sh.finish()
		sh.reportedDone()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// LogMetrics receives the shipping figures (internal/metrics.AgentLogs).
type LogMetrics interface {
	// Shipped: a chunk of bytes (dropped of them dropped at the writer) is
	// stored, lag after the writer received its first byte.
	Shipped(stream string, bytes, dropped int64, lag time.Duration)
	// Behind: bytes written on this node and not yet stored, all attempts.
	Behind(bytes int64)
}

// backlog sums what every shipment has yet to store, for LogMetrics.
type backlog struct {
	mu      sync.Mutex
	metrics LogMetrics
	bytes   map[string][2]int64 // by attempt, by stream
}

func (b *backlog) set(attempt string, s nodelog.Stream, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.bytes[attempt]
	v[s] = n
	b.bytes[attempt] = v
	b.report()
}

func (b *backlog) forget(attempt string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.bytes, attempt)
	b.report()
}

func (b *backlog) report() {
	if b.metrics == nil {
		return
	}
	var total int64
	for _, v := range b.bytes {
		total += v[0] + v[1]
	}
	b.metrics.Behind(total)
}
