package main

import (
	"fmt"
	"strconv"
)

func (r *floodResult) report(rep *Report, o logsOpts, mode string) {
	for i, c := range r.cases {
		rep.add("command round trip p50, flood vs idle, "+c.Name, c.FloodCmd.P50, "ms", c.IdleCmd.P50, "idle p50")
		row := rep.add("command round trip p99, flood vs idle, "+c.Name, c.FloodCmd.P99, "ms", c.IdleCmd.P99, "idle p99")
		if i == 0 {
			row.goal("p99 ≤ 2× idle", c.FloodCmd.P99 <= 2*c.IdleCmd.P99)
		}
		rep.add("core request/reply p99, flood vs idle, "+c.Name, c.FloodRR.P99, "ms", c.IdleRR.P99, "idle p99")
		rep.add("busy cores, all processes on the machine, flood vs idle, "+c.Name, c.FloodMachineCores, "cores", c.IdleMachineCores, "idle")
		rep.add("  of which this process (NATS, control plane, agent), "+c.Name, c.FloodProcCores, "cores", c.IdleProcCores, "idle")
		if mode == "containerd" {
			rep.add("  of which the Run's log writer process, "+c.Name, c.WriterCores, "cores", 0, "")
		}
		if ct := c.Control; ct != nil {
			rep.add("command round trip p99, same workload to /dev/null vs idle", ct.Cmd.P99, "ms", c.IdleCmd.P99, "idle p99")
			rep.add("core request/reply p99, same workload to /dev/null vs idle", ct.RR.P99, "ms", c.IdleRR.P99, "idle p99")
			rep.add("busy cores, all processes, same workload to /dev/null vs idle", ct.MachineCores, "cores", c.IdleMachineCores, "idle")
			rep.add("  of which its log writer process (reading nothing)", ct.WriterCores, "cores", 0, "")
		}
		mib := func(b int64) float64 { return float64(b) / (1 << 20) }
		rep.add("flood written (kept + dropped), "+c.Name, mib(c.Kept+c.Dropped), "MiB", 0, "")
		rep.add("flood kept and shipped, "+c.Name, mib(c.Kept)/max(c.RunS, 1e-9), "MiB/s", 0, "")
		rep.add("ship lag p99 (writer → stored), "+c.Name, c.Lag.P99, "ms", 0, "")
	}
	rep.Details["flood_cases"] = r.cases
	rep.Details["flood_mode"] = mode
	how := fmt.Sprintf("a busybox container (%d millicores) on a private containerd, the shim running this binary as its log writer; `yes` of a 100-byte line in 16 MiB batches", o.floodCPU)
	if mode == "writer" {
		how = "the no-op runtime, the bench writing the Run's output directory with nodelog.Write (in this process) from an in-memory reader of 100-byte lines at " + strconv.Itoa(o.writerMiBs) + " MiB/s"
	}
	rep.note("flood: %s, for %s (limit off: at most %d MiB); round trips timed from %s after the Run is running until it ends (its output stored)",
		how, o.floodFor, o.floodMiB, o.settle)
	for _, c := range r.cases {
		rep.note("%s: %d idle and %d flood samples over %.1f s; the Run ran %.1f s; kept %.1f MiB, dropped %.1f MiB; max backlog %.1f MiB",
			c.Name, c.IdleCmd.N, c.FloodCmd.N, c.TimedS, c.RunS, float64(c.Kept)/(1<<20), float64(c.Dropped)/(1<<20), float64(c.BehindMax)/(1<<20))
	}
	rep.note("command = PrepareImage (image answered at once by a wrapper, the runtime not asked), one in flight, %s pause before each, interleaved with core request/reply; each waits untimed for its ack", o.pace)
}
