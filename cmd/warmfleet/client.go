package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// connect opens a quiet connection for CLI use.
func (g *globals) connect(ctx context.Context) (*bus.Conn, error) {
	opts, err := bus.EnvClientOptions() // TLS and login from WARMFLEET_NATS_* (docs/security.md)
	if err != nil {
		return nil, err
	}
	conn, err := bus.Connect(g.natsURL, "warmfleet-cli", zap.NewNop(), opts...)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := conn.WaitConnected(cctx); err != nil {
		last := conn.NC.LastError()
		conn.Close()
		if bus.IsAuthError(last) {
			return nil, fmt.Errorf("NATS at %s refused this login (%v): set %s to the operator token file (docs/security.md)", g.natsURL, last, bus.EnvNATSTokenFile)
		}
		return nil, fmt.Errorf("no NATS server at %s (start one with `warmfleet serve` or pass --nats-url): %w", g.natsURL, err)
	}
	return conn, nil
}

// render writes v as JSON with -o json, else calls table.
func (g *globals) render(w io.Writer, v any, table func(*tabwriter.Writer)) error {
	switch g.output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	default:
		return fmt.Errorf("-o %q: use table or json", g.output)
	}
}

// readEvents calls each with a Run's events in order. With until nil it
// returns once it has read what is stored; otherwise it keeps reading, as
// they arrive, until an event for which until is true, or ctx ends.
func readEvents(ctx context.Context, js jetstream.JetStream, runID string, until func(schemas.RunEvent) bool, each func(schemas.RunEvent)) error {
	follow := until != nil
	c, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.RunEvents(runID)}})
	if err != nil {
		return fmt.Errorf("read events of %s: %w", runID, err)
	}
	for {
		batch, err := c.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var ev schemas.RunEvent
			if err := codec.Decode(codec.Detect(m.Headers(), m.Data()), m.Data(), &ev); err != nil {
				continue
			}
			each(ev)
			md, _ := m.Metadata()
			if follow && until(ev) {
				return nil
			}
			if !follow && md != nil && md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil {
			return err
		}
		if got == 0 && !follow {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// terminal reports whether ev moves its Run to a terminal phase.
func terminal(ev schemas.RunEvent) bool { return ev.Type == schemas.EventPhase && ev.Phase.Terminal() }

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
