package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/usage"
	"github.com/warmfleet/warmfleet/schemas"
)

// usageReport is `warmfleet usage`'s answer: what ended attempts cost
// from Since to Until, per tenant and GPU model.
type usageReport struct {
	Since    time.Time  `json:"since"`
	Until    time.Time  `json:"until"`
	Tenant   string     `json:"tenant,omitempty"`
	Rows     []usageRow `json:"rows"`
	TotalUSD float64    `json:"total_usd"`
	// Skipped counts stored messages that were not usage records.
	Skipped int `json:"skipped,omitempty"`
}

// usageRow sums one tenant's attempts on one GPU model ("" for CPU-only).
type usageRow struct {
	Tenant    string  `json:"tenant"`
	GPUModel  string  `json:"gpu_model"`
	Attempts  int     `json:"attempts"`
	GPUHours  float64 `json:"gpu_hours"`
	HeldHours float64 `json:"held_hours"`
	CostUSD   float64 `json:"cost_usd"`
}

// maxUsageSince is how far back --since may reach: WF_USAGE keeps no more.
const maxUsageSince = bus.UsageMaxAge

func newUsageCmd(g *globals) *cobra.Command {
	var since string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Sum what ended attempts cost, per tenant and GPU model (operators)",
		Long: `Sum WF_USAGE, the records of ended attempts, per tenant and GPU model: attempts,
GPU-hours (cards × hours held), hours held and USD. --since reaches back from now
(24h, 90m, 7d; at most 400d). The global --tenant, when given on the command line,
sums one tenant; otherwise every tenant is summed. Attempts still running are not
counted until they end (their tenants' budgets count them as they run).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			back, err := parseSince(since)
			if err != nil {
				return err
			}
			tenant := ""
			if cmd.Flags().Changed("tenant") {
				if err := schemas.ValidateTenant("--tenant", g.tenant); err != nil {
					return err
				}
				tenant = g.tenant
			}
			if g.identity() != bus.OperatorUser {
				return fmt.Errorf("warmfleet usage reads WF_USAGE, which only operators may: unset %s to log in as the operator", bus.EnvNATSInboxName)
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			until := time.Now().UTC()
			rep, err := readUsage(cmd.Context(), conn.JS, tenant, until.Add(-back), until)
			if err != nil {
				return err
			}
			return g.render(cmd.OutOrStdout(), rep, func(tw *tabwriter.Writer) { rep.table(tw) })
		},
	}
	cmd.Flags().StringVar(&since, "since", "24h", "how far back from now to sum: a duration (24h, 90m) or days (7d), at most 400d")
	return cmd
}

// parseSince reads --since: a Go duration or a whole number of days.
func parseSince(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		// Bounded before multiplying: a huge count must not wrap around.
		if err != nil || n <= 0 || n > int(maxUsageSince/(24*time.Hour)) {
			return 0, sinceRefusal(s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, sinceRefusal(s)
		}
	}
	if d <= 0 || d > maxUsageSince {
		return 0, sinceRefusal(s)
	}
	return d, nil
}

func sinceRefusal(s string) error {
	return &schemas.Refusal{Code: schemas.CodeMalformed, Field: "--since",
		Reason: fmt.Sprintf("%q is not a span back from now: give a positive duration (24h, 90m) or days (7d), at most 400d", s)}
}

// readUsage sums the records WF_USAGE stored from since on (of tenant;
// "" for every tenant) whose attempts ended between since and until.
func readUsage(ctx context.Context, js jetstream.JetStream, tenant string, since, until time.Time) (usageReport, error) {
	rep := usageReport{Since: since, Until: until, Tenant: tenant, Rows: []usageRow{}}
	subject := bus.SubjectUsageAll
	if tenant != "" {
		subject = bus.UsageSubject(tenant)
	}
	c, err := js.OrderedConsumer(ctx, bus.StreamUsage, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		return rep, fmt.Errorf("read %s: %w", bus.StreamUsage, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return rep, fmt.Errorf("read %s: %w", bus.StreamUsage, err)
	}
	rows := map[[2]string]*usageRow{}
	for pending := info.NumPending; pending > 0; {
		batch, err := c.Fetch(int(min(pending, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return rep, fmt.Errorf("read %s: %w", bus.StreamUsage, err)
		}
		got := uint64(0)
		for m := range batch.Messages() {
			got++
			var rec schemas.UsageRecord
			if usage.DecodeRecord(m.Headers(), m.Data(), &rec) != nil || (tenant != "" && rec.Tenant != tenant) {
				rep.Skipped++
				continue
			}
			if rec.EndedAt.Before(since) || rec.EndedAt.After(until) {
				continue
			}
			rep.add(rows, rec)
		}
		if err := batch.Error(); err != nil || got == 0 {
			return rep, fmt.Errorf("read %s: stopped with %d of %d records read: %v", bus.StreamUsage, info.NumPending-pending, info.NumPending, err)
		}
		pending -= min(got, pending)
	}
	for _, r := range rows {
		rep.Rows = append(rep.Rows, *r)
	}
	slices.SortFunc(rep.Rows, func(a, b usageRow) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.GPUModel, b.GPUModel))
	})
	return rep, nil
}

func (rep *usageReport) add(rows map[[2]string]*usageRow, rec schemas.UsageRecord) {
	k := [2]string{rec.Tenant, rec.GPUModel}
	r := rows[k]
	if r == nil {
		r = &usageRow{Tenant: rec.Tenant, GPUModel: rec.GPUModel}
		rows[k] = r
	}
	hours := rec.Seconds / 3600
	r.Attempts++
	r.HeldHours += hours
	r.GPUHours += hours * float64(rec.GPUs)
	r.CostUSD += rec.CostUSD
	rep.TotalUSD += rec.CostUSD
}

func (rep usageReport) table(tw io.Writer) {
	fmt.Fprintf(tw, "attempts ended %s to %s\n", rep.Since.Format(time.RFC3339), rep.Until.Format(time.RFC3339))
	fmt.Fprintln(tw, "TENANT\tGPU MODEL\tATTEMPTS\tGPU-HOURS\tHELD HOURS\tUSD")
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\n", r.Tenant, or(r.GPUModel, "-"), r.Attempts, r.GPUHours, r.HeldHours, r.CostUSD)
	}
	fmt.Fprintf(tw, "TOTAL\t\t\t\t\t%.2f\n", rep.TotalUSD)
	if rep.Skipped > 0 {
		fmt.Fprintf(tw, "(%d stored messages were not usage records and were skipped)\n", rep.Skipped)
	}
}
