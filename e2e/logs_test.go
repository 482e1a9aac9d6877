package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// storedOutput is what WF_LOGS holds for one Run, checked chunk by chunk.
type storedOutput struct {
	// bytes are each (attempt, stream)'s bytes in offset order.
	bytes map[[2]string][]byte
	// duplicates counts chunks stored more than once or overlapping others.
	duplicates int
	// gaps counts chunks that start past the end of what came before.
	gaps int
	// ended holds the length each closing message stated.
	ended map[[2]string]int64
	nodes map[string]bool
}

// stored reads every chunk WF_LOGS holds for runID, straight from the
// stream: a second copy of a chunk counts as a duplicate here even though
// readers would skip it.
func (f *fleet) stored(runID string) storedOutput {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := storedOutput{bytes: map[[2]string][]byte{}, ended: map[[2]string]int64{}, nodes: map[string]bool{}}
	c, err := f.conn.JS.OrderedConsumer(ctx, bus.StreamLogs, jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.RunLogs(runID)}})
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for left := info.NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			f.t.Fatalf("read logs of %s: %v", runID, err)
		}
		h := m.Headers()
		key := [2]string{h.Get(bus.HeaderLogAttempt), h.Get(bus.HeaderLogStream)}
		out.nodes[h.Get(bus.HeaderLogNode)] = true
		if end := h.Get(bus.HeaderLogEnd); end != "" {
			n, _ := strconv.ParseInt(end, 10, 64)
			out.ended[key] = n
			continue
		}
		off, err := strconv.ParseInt(h.Get(bus.HeaderLogOffset), 10, 64)
		if err != nil {
			f.t.Fatalf("chunk without an offset: %v", h)
		}
		have := int64(len(out.bytes[key]))
		switch {
		case off < have:
			out.duplicates++
		case off > have:
			out.gaps++
		default:
			out.bytes[key] = append(out.bytes[key], m.Data()...)
		}
	}
	return out
}

// numbered checks that b is exactly the lines "<prefix> 1" .. "<prefix> n".
func numbered(b []byte, prefix string, n int) error {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != n {
		return fmt.Errorf("%d lines, want %d (first %q, last %q)", len(lines), n, lines[0], lines[len(lines)-1])
	}
	for i, l := range lines {
		if want := prefix + " " + strconv.Itoa(i+1); l != want {
			return fmt.Errorf("line %d is %q, want %q", i, l, want)
		}
	}
	return nil
}

// printer prints n numbered lines to stdout and to stderr, interleaved.
func printer(n int, pause string) []string {
	return []string{"sh", "-c", fmt.Sprintf(`seq 1 %d | while read i; do echo "out $i"; echo "err $i" >&2; %s done`, n, pause)}
}

// TestAcceptance_RunLogs: a Run prints 100,000 numbered lines to stdout and
// to stderr; WF_LOGS holds every one once, in order, per stream, each
// stream closed with its length, as soon as the Run's phase is terminal.
func TestAcceptance_RunLogs(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	f.startAgent(agentSpec{id: "node-a", world: w})
	const n = 100_000
	id := f.submit(schemas.RunRequest{RequestID: "logs-100k", Image: w.image.Reference, Command: printer(n, "")})
	f.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)

	got := f.stored(id)
	attempt := schemas.WorkloadID(id, 1)
	if got.duplicates != 0 || got.gaps != 0 {
		t.Fatalf("%d duplicate and %d gapped chunks stored", got.duplicates, got.gaps)
	}
	for stream, prefix := range map[string]string{bus.LogStdout: "out", bus.LogStderr: "err"} {
		key := [2]string{attempt, stream}
		if err := numbered(got.bytes[key], prefix, n); err != nil {
			t.Errorf("%s: %v", stream, err)
		}
		if end, ok := got.ended[key]; !ok || end != int64(len(got.bytes[key])) {
			t.Errorf("%s closed at %d (%v), holds %d bytes", stream, end, ok, len(got.bytes[key]))
		}
	}
	if !got.nodes["node-a"] || len(got.nodes) != 1 {
		t.Errorf("chunks name nodes %v, want node-a", got.nodes)
	}
	_ = bytes.Equal
}
