package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/schemas"
)

// attemptContent is one attempt's output, generated once and written into
// a fresh directory each round.
type attemptContent struct {
	out, err []byte
	lines    int64
}

// genContent makes size bytes of numbered log lines of about meanLine
// bytes each (half to one and a half of it); every 16th goes to stderr.
func genContent(seed uint64, size int64, meanLine int) attemptContent {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	const filler = "the quick brown fox jumps over the lazy dog while the data loader prefetches the next shard of tokens "
	c := attemptContent{out: make([]byte, 0, size+size/8), err: make([]byte, 0, size/8)}
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for n := int64(0); int64(len(c.out)+len(c.err)) < size; n++ {
		at := t0.Add(time.Duration(n) * 1337 * time.Microsecond).Format("2006-01-02T15:04:05.000000Z")
		want := meanLine/2 + r.IntN(meanLine+1)
		if n%16 == 15 {
			line := fmt.Appendf(nil, "%s WARN  step=%09d grad_norm=%.4f clipped to 1.0 ", at, n, 1+r.Float64()*9)
			c.err = append(c.err, pad(line, want, filler)...)
		} else {
			line := fmt.Appendf(nil, "%s INFO  step=%09d loss=%.6f lr=3.0e-04 tok/s=%d ", at, n, r.Float64()*4, 40000+r.IntN(20000))
			c.out = append(c.out, pad(line, want, filler)...)
		}
		c.lines++
	}
	return c
}

// pad fills line to about want bytes (never cutting its fields) and ends it.
func pad(line []byte, want int, filler string) []byte {
	for len(line) < want-1 {
		line = append(line, filler[:min(len(filler), want-1-len(line))]...)
	}
	return append(line, '\n')
}

// rawAttempt is one attempt's chunks, read back from its directory.
type rawAttempt struct {
	chunks [2][]nodelog.Chunk
	size   [2]int64
}

func readChunks(dir string) (rawAttempt, error) {
	var ra rawAttempt
	for _, s := range nodelog.Streams {
		t := nodelog.NewTail(dir, s, 0)
		for {
			c, ok, err := t.Next(bus.MaxLogChunk, true, time.Now())
			if err != nil {
				_ = t.Close()
				return ra, err
			}
			if !ok {
				break
			}
			ra.chunks[s] = append(ra.chunks[s], c)
			ra.size[s] = c.End()
		}
		_ = t.Close()
	}
	return ra, nil
}

// publish sends the attempt's chunks as the agent does, as Run runID's
// first attempt (ids must differ from every earlier phase's, or dedupe
// drops them), with at most benchLogWindow in flight: a sliding window, or
// (batch) filled and then drained whole, as agent/output's pump does.
// Then each stream's end.
func (ra rawAttempt) publish(ctx context.Context, js jetstream.JetStream, runID, node string, batch bool) error {
	subject, attempt := bus.RunLogsSubject(schemas.DefaultTenant, runID), schemas.WorkloadID(runID, 1)
	var queue []jetstream.PubAckFuture
	ackHead := func() error {
		select {
		case <-queue[0].Ok():
		case err := <-queue[0].Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		queue = queue[1:]
		return nil
	}
	for _, s := range nodelog.Streams {
		for _, c := range ra.chunks[s] {
			if len(queue) >= benchLogWindow {
				// Sliding: the oldest ack frees one slot. Batch: all of them.
				for n := len(queue); len(queue) > 0 && (batch || len(queue) == n); {
					if err := ackHead(); err != nil {
						return err
					}
				}
			}
			m := bus.LogChunkMsg(subject, attempt, s.String(), node, c.Offset, c.At, c.Data)
			f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(bus.LogMsgID(attempt, s.String(), c.Offset)))
			if err != nil {
				return err
			}
			queue = append(queue, f)
		}
	}
	for len(queue) > 0 {
		if err := ackHead(); err != nil {
			return err
		}
	}
	for _, s := range nodelog.Streams {
		m := bus.LogEndMsg(subject, attempt, s.String(), node, ra.size[s])
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(bus.LogEndMsgID(attempt, s.String())))
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
