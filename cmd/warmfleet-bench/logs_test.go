package main

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/schemas"
)

func TestGenContentIsWholeNumberedLines(t *testing.T) {
	const size, mean = 1 << 20, 120
	c := genContent(1, size, mean)
	if got := int64(len(c.out) + len(c.err)); got < size || got > size+2*mean {
		t.Fatalf("%d bytes, want %d and at most one line more", got, size)
	}
	outLines, errLines := int64(bytes.Count(c.out, []byte("\n"))), int64(bytes.Count(c.err, []byte("\n")))
	if outLines+errLines != c.lines || c.out[len(c.out)-1] != '\n' || c.err[len(c.err)-1] != '\n' {
		t.Fatalf("%d+%d newlines, %d lines counted; both streams must end a line", outLines, errLines, c.lines)
	}
	if errLines != c.lines/16 {
		t.Errorf("%d stderr lines of %d, want every 16th", errLines, c.lines)
	}
	if avg := float64(len(c.out)+len(c.err)) / float64(c.lines); avg < mean*0.85 || avg > mean*1.15 {
		t.Errorf("mean line %.0f bytes, want about %d", avg, mean)
	}
	// Numbered: the step field counts lines across both streams.
	if !bytes.Contains(c.out, []byte("step=000000000 ")) || !bytes.Contains(c.err, []byte("step=000000015 ")) {
		t.Error("lines are not numbered from 0 with the 16th on stderr")
	}
}

// The raw baseline must store exactly what the agent would: the chunks read
// back from the directory, byte for byte, each stream closed with its
// length, in both window patterns.
func TestRawPublishStoresTheDirectorysChunks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.StartNATS(t)
	conn := testenv.Dial(t, srv.URL(), "bench-test")
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	stream, err := conn.JS.Stream(ctx, bus.StreamLogs)
	if err != nil {
		t.Fatal(err)
	}
	c := genContent(7, 3<<20, 120)
	dir, err := agent.PrepareOutput(t.TempDir(), schemas.DefaultTenant, "r-src", "r-src-a1")
	if err != nil {
		t.Fatal(err)
	}
	if err := nodelog.Write(nodelog.WriterSpec{Dir: dir}, [2]io.Reader{bytes.NewReader(c.out), bytes.NewReader(c.err)}, func() {}, time.Now); err != nil {
		t.Fatal(err)
	}
	ra, err := readChunks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ra.size[nodelog.Stdout] != int64(len(c.out)) || ra.size[nodelog.Stderr] != int64(len(c.err)) {
		t.Fatalf("chunks cover %v bytes, the streams hold %d and %d", ra.size, len(c.out), len(c.err))
	}
	for i, batch := range []bool{false, true} {
		runID := "r-raw" + strconv.Itoa(i)
		fig, err := storedPhase(ctx, stream, nil, func() error { return ra.publish(ctx, conn.JS, runID, "node-t", batch) })
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(len(ra.chunks[0]) + len(ra.chunks[1]) + 2); fig.Stored != want || fig.WindowS <= 0 {
			t.Fatalf("batch %v: stored %d messages over %.3fs, want %d", batch, fig.Stored, fig.WindowS, want)
		}
		var got [2]bytes.Buffer
		ends := 0
		for seq := fig.firstSeq; seq < fig.firstSeq+fig.Stored; seq++ {
			m, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			s := nodelog.Stdout
			if m.Header.Get(bus.HeaderLogStream) == bus.LogStderr {
				s = nodelog.Stderr
			}
			if m.Subject != bus.RunLogsSubject(schemas.DefaultTenant, runID) || m.Header.Get(bus.HeaderLogAttempt) != schemas.WorkloadID(runID, 1) {
				t.Fatalf("message %d on %s for %q", seq, m.Subject, m.Header.Get(bus.HeaderLogAttempt))
			}
			if end := m.Header.Get(bus.HeaderLogEnd); end != "" {
				ends++
				if end != strconv.Itoa(got[s].Len()) {
					t.Fatalf("%s ends at %s after %d bytes", s, end, got[s].Len())
				}
				continue
			}
			if off := m.Header.Get(bus.HeaderLogOffset); off != strconv.Itoa(got[s].Len()) || len(m.Data) > bus.MaxLogChunk || m.Data[len(m.Data)-1] != '\n' {
				t.Fatalf("%s chunk at %s (have %d bytes), %d bytes, not whole lines", s, off, got[s].Len(), len(m.Data))
			}
			got[s].Write(m.Data)
		}
		if ends != 2 || !bytes.Equal(got[0].Bytes(), c.out) || !bytes.Equal(got[1].Bytes(), c.err) {
			t.Fatalf("batch %v: %d ends; stdout equal %v, stderr equal %v", batch, ends, bytes.Equal(got[0].Bytes(), c.out), bytes.Equal(got[1].Bytes(), c.err))
		}
	}
}

func TestFloodReaderKeepsItsRateAndCap(t *testing.T) {
	const rate, limit = 8 << 20, 1 << 20
	f := newFloodReader(time.Minute, limit, rate)
	t0 := time.Now()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != limit {
		t.Fatalf("read %d bytes, want the cap %d", len(b), limit)
	}
	if took, least := time.Since(t0), time.Second*(limit-64<<10)/rate; took < least {
		t.Fatalf("read %d bytes in %s, faster than %d B/s allows (%s)", len(b), took, rate, least)
	}
	if lines := bytes.Count(b, []byte("\n")); lines < limit/(len(floodLine)+1)-1 || !bytes.HasPrefix(b, []byte("flood step=000000 ")) {
		t.Fatalf("%d lines, want %d-byte numbered lines", lines, len(floodLine)+1)
	}
}
