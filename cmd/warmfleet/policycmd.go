package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/controlplane/policy"
	"github.com/warmfleet/warmfleet/schemas"
)

func newPolicyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Check a scheduling policy file (serve --scheduling-policy-file)"}
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a scheduling policy file offline: OK and a summary, or the refusal naming the field (exit 1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			snap, err := policy.Read(args[0])
			if err != nil {
				return err
			}
			p, version := snap.SchedulingPolicy, snap.Version
			if g.output == "json" {
				return g.render(cmd.OutOrStdout(), struct {
					OK      bool                     `json:"ok"`
					Version string                   `json:"version"`
					Policy  schemas.SchedulingPolicy `json:"policy"`
				}{true, version, p}, nil)
			}
			return printPolicySummary(cmd.OutOrStdout(), args[0], version, p)
		},
	})
	return cmd
}

// printPolicySummary says what the control plane would schedule by.
func printPolicySummary(w io.Writer, path, version string, p schemas.SchedulingPolicy) error {
	fmt.Fprintf(w, "OK %s (version %s)\n", path, version[:12])
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(p.PriorityClasses) == 0 {
		fmt.Fprintln(tw, "Priority classes:\tnone (every Run has value 0 and preempts nothing)")
	} else {
		fmt.Fprintln(tw, "CLASS\tVALUE\tPREEMPTS\tDEFAULT")
		for _, c := range p.PriorityClasses {
			fmt.Fprintf(tw, "%s\t%d\t%v\t%v\n", c.Name, c.Value, c.Preempts, c.Name == p.DefaultPriority)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWEIGHT\tCOHORT\tQUOTA\tBUDGET\tRETRY")
	rows := slices.Sorted(maps.Keys(p.Tenants))
	for _, name := range rows {
		printTenantRow(tw, name, p.Tenants[name])
	}
	printTenantRow(tw, "(default)", p.Default)
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.GPUHourPrice > 0 {
		fmt.Fprintf(w, "Held-idle GPU price: %.2f USD/GPU-hour\n", p.GPUHourPrice)
	}
	if len(p.OwnedGPUHourRates) > 0 {
		var rates []string
		for _, k := range slices.Sorted(maps.Keys(p.OwnedGPUHourRates)) {
			rates = append(rates, fmt.Sprintf("%s=%.2f", k, p.OwnedGPUHourRates[k]))
		}
		fmt.Fprintf(w, "Owned GPU-hour rates (USD): %s\n", strings.Join(rates, " "))
	}
	return nil
}

func printTenantRow(w io.Writer, name string, t schemas.TenantPolicy) {
	weight := t.Weight
	if weight == 0 {
		weight = 1
	}
	budget := "-"
	if b := t.Budget; b != nil {
		budget = fmt.Sprintf("%.2f USD/%s", b.AmountUSD, b.Period)
		if b.StopRunning {
			budget += " (stops running)"
		}
	}
	fmt.Fprintf(w, "%s\t%g\t%s\t%s\t%s\t%s\n", name, weight, or(t.Cohort, "-"), quotaString(t.Quota), budget, retryString(t.Retry))
}

// quotaString is a quota in one line, "-" for none.
func quotaString(q *schemas.Quota) string {
	if q == nil {
		return "-"
	}
	var parts []string
	if q.Runs != nil {
		parts = append(parts, fmt.Sprintf("runs=%d", *q.Runs))
	}
	for _, k := range slices.Sorted(maps.Keys(q.GPUs)) {
		parts = append(parts, fmt.Sprintf("gpus(%s)=%d", k, q.GPUs[k]))
	}
	if q.CPUMillis != nil {
		parts = append(parts, fmt.Sprintf("cpu_millis=%d", *q.CPUMillis))
	}
	if q.MemoryBytes != nil {
		parts = append(parts, "memory="+schemas.FormatBytes(*q.MemoryBytes))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// retryString is a retry policy in one line.
func retryString(r *schemas.RetryPolicy) string {
	if r == nil {
		return "-"
	}
	on := make([]string, len(r.On))
	for i, e := range r.On {
		on[i] = string(e)
	}
	s := fmt.Sprintf("on %s, at most %d attempts", or(strings.Join(on, ","), "nothing"), r.MaxAttempts)
	if r.Backoff != "" {
		s += ", backoff " + r.Backoff
	}
	return s
}
