package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

// simSeconds summarises a sample of seconds.
type simSeconds struct {
	P50  float64 `json:"p50_s"`
	P95  float64 `json:"p95_s"`
	P99  float64 `json:"p99_s"`
	Mean float64 `json:"mean_s"`
}

func summariseSeconds(xs []float64) simSeconds {
	if len(xs) == 0 {
		return simSeconds{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum float64
	for _, x := range s {
		sum += x
	}
	return simSeconds{P50: q(0.50), P95: q(0.95), P99: q(0.99), Mean: sum / float64(len(s))}
}

// simResult is one policy's outcome on one trace.
type simResult struct {
	Policy string `json:"policy"`
	Runs   int    `json:"runs"`
	// TimeToStart is submit → running: queueing plus the wait for bytes.
	TimeToStart simSeconds `json:"time_to_start"`
	// QueueDelay is submit → cards held (in the scheduler's queue or a
	// node's).
	QueueDelay simSeconds `json:"queue_delay"`
	// PullWait is cards held → running: the bytes still arriving.
	PullWait      simSeconds `json:"pull_wait"`
	ImageBytes    int64      `json:"image_bytes_pulled"`
	ArtifactBytes int64      `json:"artifact_bytes_fetched"`
	// GPUHoursPullWait are card-hours idle while a Run's bytes arrive:
	// held by the Run, or free but kept for it (GPUHoursKept).
	GPUHoursPullWait float64 `json:"gpu_hours_waiting_on_pulls"`
	// GPUHoursKept are the free card-hours kept for Runs fetching their
	// bytes on a node before they claim cards (warmfleet's fetch first).
	GPUHoursKept float64 `json:"gpu_hours_kept_for_pulls"`
	// GPUHoursRun are card-hours the Runs ran: the scale for the above.
	GPUHoursRun float64 `json:"gpu_hours_running"`
	// QueuedOnNode are Runs booked behind a busy node.
	QueuedOnNode int `json:"queued_on_node"`
	Evictions    int `json:"evictions"`
	Decisions    int `json:"decisions"`
	// DecisionsPerRun is Decisions over Runs, MaxDecisions the most any
	// one Run got: the re-decision rule keeps both bounded.
	DecisionsPerRun float64 `json:"decisions_per_run"`
	MaxDecisions    int     `json:"max_decisions_per_run"`
	// BookedBusy are decisions to start a Run now on a node whose cards
	// were held (the simulator queues it there instead).
	BookedBusy int `json:"booked_on_busy_node,omitempty"`
}

// BytesPulled is image and artifact bytes together.
func (r simResult) BytesPulled() int64 { return r.ImageBytes + r.ArtifactBytes }

// result summarises a finished simulation.
func (s *simulator) result() simResult {
	res := simResult{Policy: s.policy.name(), Runs: len(s.runs), Decisions: s.decisions, BookedBusy: s.bookedBusy, MaxDecisions: slices.Max(append([]int{0}, s.decided...))}
	if len(s.runs) > 0 {
		res.DecisionsPerRun = float64(s.decisions) / float64(len(s.runs))
	}
	var tts, queue, pull []float64
	for i, st := range s.state {
		r := s.runs[i]
		tts = append(tts, st.runningAt-r.arrival)
		queue = append(queue, st.cardsAt-r.arrival)
		pull = append(pull, st.runningAt-st.cardsAt)
		res.ImageBytes += st.pulled
		res.ArtifactBytes += st.fetch
		res.GPUHoursPullWait += float64(r.gpus) * (st.runningAt - st.cardsAt) / 3600
		res.GPUHoursRun += float64(r.gpus) * r.duration / 3600
		if st.queued {
			res.QueuedOnNode++
		}
	}
	for _, n := range s.nodes {
		res.Evictions += n.evictions
	}
	res.GPUHoursKept = s.kept / 3600
	res.GPUHoursPullWait += res.GPUHoursKept
	res.TimeToStart, res.QueueDelay, res.PullWait = summariseSeconds(tts), summariseSeconds(queue), summariseSeconds(pull)
	return res
}

// simTraceResult is every policy's outcome on one trace.
type simTraceResult struct {
	Trace       string `json:"trace"`
	Description string `json:"description"`
	Nodes       int    `json:"nodes"`
	GPUs        int    `json:"gpus"`
	Runs        int    `json:"runs"`
	// FloorBytes are the distinct layers and artifacts the Runs use, each
	// counted once: the least any placement could pull.
	FloorBytes int64       `json:"floor_bytes"`
	Policies   []simResult `json:"policies"`
}

func (t simTraceResult) policy(name string) (simResult, bool) {
	for _, p := range t.Policies {
		if p.Policy == name {
			return p, true
		}
	}
	return simResult{}, false
}

// printSimTables writes one table per trace, policies as rows.
func printSimTables(w io.Writer, results []simTraceResult) error {
	for _, t := range results {
		fmt.Fprintf(w, "\ntrace %s — %d nodes, %d GPUs, %d Runs: %s; distinct bytes the Runs use (the least any placement pulls): %.1f GB\n", t.Trace, t.Nodes, t.GPUs, t.Runs, t.Description, gb(t.FloorBytes))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "POLICY\tSTART p50 s\tp95 s\tp99 s\tQUEUE mean s\tp95 s\tPULLED GB\tIMAGE GB\tARTIFACT GB\tGPU-h PULL WAIT\tKEPT\tQUEUED ON NODE\tBOOKED BUSY\tEVICTIONS\tDECISIONS/RUN\tMAX\t")
		for _, p := range t.Policies {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%d\t%d\t%d\t%.2f\t%d\t\n", p.Policy,
				p.TimeToStart.P50, p.TimeToStart.P95, p.TimeToStart.P99, p.QueueDelay.Mean, p.QueueDelay.P95,
				gb(p.BytesPulled()), gb(p.ImageBytes), gb(p.ArtifactBytes), p.GPUHoursPullWait, p.GPUHoursKept, p.QueuedOnNode, p.BookedBusy, p.Evictions, p.DecisionsPerRun, p.MaxDecisions)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	return nil
}

func gb(b int64) float64 { return float64(b) / 1e9 }
