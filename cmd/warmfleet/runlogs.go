package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/runlog"
	"github.com/warmfleet/warmfleet/schemas"
)

func newRunLogs(g *globals) *cobra.Command {
	var f logFlags
	cmd := &cobra.Command{
		Use:   "logs RUN_ID",
		Short: "Print a Run's output: its stdout to stdout, its stderr to stderr",
		Long: `Print a Run's output from WF_LOGS: its stdout to stdout, its stderr to stderr,
each byte once and in order. Without --attempt, when the Run has had more
than one attempt, each attempt's lines start with a line
"==> attempt N on NODE <==" (on stdout; on stderr with --stream stderr), as
do a retry's lines that -f sees start. The bytes are the ones the Run wrote,
binary included: no newline is added to a last line written without one.
With -o json each line is one JSON object on stdout: "text" is the line
without its newline, "data" its exact bytes (base64) when they are not
UTF-8, and "partial": true when no newline ends it (a line longer than
1 MiB is split into several records, each partial but the last). Output
no longer stored (WF_LOGS's limits dropped it) is noted on stderr.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.check(cmd); err != nil {
				return err
			}
			if g.output != "table" && g.output != "json" {
				return fmt.Errorf("-o %q: use table or json", g.output)
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			h := g.history(conn)
			r, err := h.run(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			opts, err := f.options(cmd, r)
			if err != nil {
				return err
			}
			p := &logPrinter{out: cmd.OutOrStdout(), errw: cmd.ErrOrStderr(), runID: r.ID, timestamps: f.timestamps,
				json: g.output == "json", headers: opts.Attempt == "" && r.Attempt > 1}
			if f.stream == bus.LogStderr {
				p.headerTo = p.errw
			} else {
				p.headerTo = p.out
			}
			opts.Invalid = skipNotice(cmd.ErrOrStderr())
			opts.Gaps = gapNotice(cmd.ErrOrStderr(), r.ID)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if f.follow {
				if opts.Done, err = h.ended(ctx, r); err != nil {
					return err
				}
			}
			return runlog.ReadFrom(ctx, h.logs(r.ID), opts, p.line)
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.follow, "follow", "f", false, "keep printing new output until the Run ends")
	fl.IntVar(&f.attempt, "attempt", 0, "only this attempt's output, by number from 1 (default: every attempt)")
	fl.IntVar(&f.tail, "tail", 0, "only the last N lines (after the other filters; default: all)")
	fl.DurationVar(&f.since, "since", 0, "only lines from this long ago on, e.g. 10m or 2h (default: all)")
	fl.StringVar(&f.stream, "stream", "", "only stdout or stderr (default: both)")
	fl.BoolVar(&f.timestamps, "timestamps", false, "prefix each line with when the node received it (RFC 3339)")
	return cmd
}

type logFlags struct {
	follow, timestamps bool
	attempt, tail      int
	since              time.Duration
	stream             string
}

// check refuses bad flag values before anything is asked of NATS.
func (f logFlags) check(cmd *cobra.Command) error {
	if cmd.Flags().Changed("attempt") && f.attempt < 1 {
		return fmt.Errorf("--attempt %d: pass an attempt number from 1 (`warmfleet run get` shows the latest)", f.attempt)
	}
	if f.tail < 0 {
		return fmt.Errorf("--tail %d: pass a number of lines from 1 (leave it out for all)", f.tail)
	}
	if cmd.Flags().Changed("since") && f.since <= 0 {
		return fmt.Errorf("--since %s: pass a positive duration such as 10m or 2h", f.since)
	}
	if f.stream != "" && f.stream != bus.LogStdout && f.stream != bus.LogStderr {
		return fmt.Errorf("--stream %q: pass %s or %s (leave it out for both)", f.stream, bus.LogStdout, bus.LogStderr)
	}
	return nil
}

// options turns the flags into runlog options for Run r.
func (f logFlags) options(cmd *cobra.Command, r schemas.Run) (runlog.Options, error) {
	o := runlog.Options{Stream: f.stream, Tail: f.tail, Follow: f.follow}
	if cmd.Flags().Changed("attempt") {
		switch {
		case r.Attempt < 1 && f.attempt > 1:
			return o, fmt.Errorf("--attempt %d: pass 1; run %s has not been placed yet", f.attempt, r.ID)
		case r.Attempt >= 1 && f.attempt > r.Attempt:
			return o, fmt.Errorf("--attempt %d: pass 1 to %d; run %s has had %d attempt(s)", f.attempt, r.Attempt, r.ID, r.Attempt)
		}
		o.Attempt = schemas.WorkloadID(r.ID, f.attempt)
	}
	if f.since > 0 {
		o.Since = time.Now().Add(-f.since)
	}
	return o, nil
}

// runEnded returns a channel closed once Run r is in a terminal phase (or
// gone), watching wf_runs until ctx ends.
func runEnded(ctx context.Context, js jetstream.JetStream, r schemas.Run) (<-chan struct{}, error) {
	done := make(chan struct{})
	if r.Phase.Terminal() {
		close(done)
		return done, nil
	}
	kv, err := js.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return nil, fmt.Errorf("watch run %s: %w", r.ID, err)
	}
	w, err := kv.Watch(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("watch run %s: %w", r.ID, err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-w.Updates():
				if e == nil {
					continue // the end of the current value
				}
				var cur schemas.Run
				if e.Operation() != jetstream.KeyValuePut || (json.Unmarshal(e.Value(), &cur) == nil && cur.Phase.Terminal()) {
					close(done)
					return
				}
			}
		}
	}()
	return done, nil
}

// logPrinter writes a Run's lines to stdout and stderr.
type logPrinter struct {
	out, errw, headerTo io.Writer
	runID               string
	timestamps, json    bool
	headers             bool   // begin each attempt's lines with a header
	last                string // the attempt of the line printed last
	// midLine: the stream's last line printed was Partial.
	midLine map[[2]string]bool
}

// jsonLine is a line as -o json prints it: Data holds the exact bytes
// when Text, JSON's UTF-8, cannot.
type jsonLine struct {
	runlog.Line
	Data []byte `json:"data,omitempty"`
}

func (p *logPrinter) line(l runlog.Line) error {
	if p.json {
		jl := jsonLine{Line: l}
		if !utf8.ValidString(l.Text) {
			jl.Data = []byte(l.Text)
		}
		b, _ := json.Marshal(jl)
		_, err := fmt.Fprintf(p.out, "%s\n", b)
		return err
	}
	if l.Attempt != p.last && (p.headers || p.last != "") {
		n := strings.TrimPrefix(l.Attempt, p.runID+"-a")
		if _, err := fmt.Fprintf(p.headerTo, "==> attempt %s on %s <==\n", n, or(l.Node, "?")); err != nil {
			return err
		}
	}
	p.last = l.Attempt
	w := p.writer(l.Stream)
	// A line's continuation (after a Partial piece) gets no timestamp: it
	// is the same line.
	key := [2]string{l.Attempt, l.Stream}
	if p.timestamps && !p.midLine[key] {
		if _, err := fmt.Fprintf(w, "%s ", l.Time.UTC().Format(time.RFC3339Nano)); err != nil {
			return err
		}
	}
	if p.midLine == nil {
		p.midLine = map[[2]string]bool{}
	}
	p.midLine[key] = l.Partial
	if _, err := io.WriteString(w, l.Text); err != nil || l.Partial {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// midLineTo says whether a stream printed to w ended its last line without
// a newline, so that warmfleet's own next line on w starts a line.
func (p *logPrinter) midLineTo(w io.Writer) bool {
	for k, mid := range p.midLine {
		if mid && p.writer(k[1]) == w {
			return true
		}
	}
	return false
}

// writer is where a stream's output is printed.
func (p *logPrinter) writer(stream string) io.Writer {
	if stream == bus.LogStderr {
		return p.errw
	}
	return p.out
}

// gapNotice tells, on w, of output of Run runID no longer stored.
func gapNotice(w io.Writer, runID string) func(runlog.Gap) {
	return func(g runlog.Gap) {
		fmt.Fprintf(w, "warmfleet: attempt %s %s: bytes %d to %d are no longer in %s (dropped by its limits: age, total size, or the cap on chunks per Run; `warmfleet serve --help` names them)\n",
			strings.TrimPrefix(g.Attempt, runID+"-a"), g.Stream, g.From, g.To, bus.StreamLogs)
	}
}

// lastLinesShown is how many lines `run get` shows of a failed or lost Run.
const lastLinesShown = 10

// lastLines returns the last lines of r's latest attempt, both streams in
// time order, when r failed or was lost; nil otherwise or when WF_LOGS
// holds none (or does not exist). Each stream is in time order by itself,
// so the last lines of both are among the last of each.
func lastLines(ctx context.Context, h history, r schemas.Run) ([]runlog.Line, error) {
	if (r.Phase != schemas.PhaseFailed && r.Phase != schemas.PhaseLost) || r.Attempt < 1 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var lines []runlog.Line
	for _, stream := range []string{bus.LogStdout, bus.LogStderr} {
		err := runlog.ReadFrom(ctx, h.logs(r.ID), runlog.Options{Attempt: schemas.WorkloadID(r.ID, r.Attempt), Stream: stream, Tail: lastLinesShown},
			func(l runlog.Line) error {
				lines = append(lines, l)
				return nil
			})
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("last lines of %s: %w", r.ID, err)
		}
	}
	slices.SortStableFunc(lines, func(a, b runlog.Line) int { return a.Time.Compare(b.Time) })
	return lines[max(len(lines)-lastLinesShown, 0):], nil
}

// printLastLines writes `run get`'s "Last lines:" section, outside the
// table so that output with tabs keeps its shape.
func printLastLines(w io.Writer, lines []runlog.Line, err error) error {
	if err != nil {
		_, err = fmt.Fprintf(w, "Last lines:\n  (not available: %v)\n", err)
		return err
	}
	if len(lines) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "Last lines:"); err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fmt.Fprintf(w, "  %s %s  %s\n", l.Time.UTC().Format("15:04:05.000"), l.Stream, l.Text); err != nil {
			return err
		}
	}
	return nil
}
