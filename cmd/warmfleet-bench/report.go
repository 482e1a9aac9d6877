package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a subcommand prints: its figures, each against a baseline
// measured in the same run, and the machine it ran on.
type Report struct {
	Bench   string   `json:"bench"`
	Machine Machine  `json:"machine"`
	Command string   `json:"command"`
	Rows    []Row    `json:"rows"`
	Notes   []string `json:"notes,omitempty"`
	// Details holds per-bench extras (latency breakdowns, counters).
	Details map[string]any `json:"details,omitempty"`
}

// Row is one figure. Ratio is Value / Baseline; Higher says whether a larger
// ratio is better (throughput) or worse (latency, CPU).
type Row struct {
	Figure   string  `json:"figure"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline float64 `json:"baseline,omitempty"`
	BaseName string  `json:"baseline_name,omitempty"`
	BaseUnit string  `json:"baseline_unit,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Goal     string  `json:"goal,omitempty"`
	Met      *bool   `json:"goal_met,omitempty"`
}

// Machine describes where the figures were taken.
type Machine struct {
	NProc      int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model"`
	MemTotal   string `json:"mem_total"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	At         string `json:"at"`
}

func machine() Machine {
	m := Machine{NProc: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), At: time.Now().UTC().Format(time.RFC3339)}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func newReport(bench string) *Report {
	return &Report{Bench: bench, Machine: machine(), Command: strings.Join(os.Args, " "), Details: map[string]any{}}
}

// add appends a figure against its baseline.
func (r *Report) add(figure string, value float64, unit string, baseline float64, baseName string) *Row {
	row := Row{Figure: figure, Value: value, Unit: unit, Baseline: baseline, BaseName: baseName, BaseUnit: unit}
	if baseline != 0 {
		row.Ratio = value / baseline
	}
	r.Rows = append(r.Rows, row)
	return &r.Rows[len(r.Rows)-1]
}

// unitOfBaseline names the baseline's unit where it differs from the figure's.
func (row *Row) unitOfBaseline(u string) *Row { row.BaseUnit = u; return row }

// goal records a goal and whether the figure met it.
func (row *Row) goal(text string, met bool) {
	row.Goal, row.Met = text, &met
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// print writes the report as a table or as JSON.
func (r *Report) print(w io.Writer, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "table", "":
	default:
		return fmt.Errorf("-o %q: use table or json", format)
	}
	m := r.Machine
	fmt.Fprintf(w, "%s — %d CPUs (%s), %s, GOMAXPROCS %d, %s, kernel %s\n", r.Bench, m.NProc, m.CPUModel, m.MemTotal, m.GOMAXPROCS, m.Go, m.Kernel)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tBASELINE\tRATIO\tGOAL")
	for _, row := range r.Rows {
		base, ratio := "-", "-"
		if row.Baseline != 0 {
			base = fmt.Sprintf("%s %s (%s)", num(row.Baseline), row.BaseUnit, row.BaseName)
			ratio = fmt.Sprintf("%.2f×", row.Ratio)
		}
		goal := row.Goal
		if row.Met != nil {
			if *row.Met {
				goal += " ✓"
			} else {
				goal += " ✗"
			}
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s\t%s\n", row.Figure, num(row.Value), row.Unit, base, ratio, goal)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "  -", n)
	}
	return nil
}

// num prints a figure with about three significant digits.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// Latencies summarises a sample of durations.
type Latencies struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	Avg float64 `json:"mean_ms"`
}

func summarise(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Latencies{N: len(s), P50: nearestRank(s, 0.50), P90: nearestRank(s, 0.90), P99: nearestRank(s, 0.99), Max: ms(s[len(s)-1]), Avg: ms(sum / time.Duration(len(s)))}
}

// pct is the p-th percentile (nearest rank) in ms.
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return nearestRank(s, p)
}

// nearestRank is the p-th percentile of sorted s by nearest rank, in ms.
func nearestRank(s []time.Duration, p float64) float64 {
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return ms(s[max(0, min(i, len(s)-1))])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
