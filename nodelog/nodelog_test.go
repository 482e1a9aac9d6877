package nodelog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock hands out increasing times, one millisecond apart.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

func write(t *testing.T, spec WriterSpec, stdout, stderr string, c *clock) {
	t.Helper()
	readyCalled := false
	err := Write(spec, [2]io.Reader{strings.NewReader(stdout), strings.NewReader(stderr)}, func() { readyCalled = true }, c.now)
	if err != nil || !readyCalled {
		t.Fatalf("Write: %v (ready %v)", err, readyCalled)
	}
}

func TestWriterKeepsStreamsApartAndMarksDone(t *testing.T) {
	dir := t.TempDir()
	write(t, WriterSpec{Dir: dir}, "out 1\nout 2\n", "err 1\n", &clock{t: time.Unix(100, 0)})
	for s, want := range map[Stream]string{Stdout: "out 1\nout 2\n", Stderr: "err 1\n"} {
		if b, _ := os.ReadFile(DataPath(dir, s)); string(b) != want {
			t.Errorf("%s = %q, want %q", s, b, want)
		}
	}
	if !Done(dir) {
		t.Fatal("not done after both streams ended")
	}
}

func TestWriterRateLimitDropsAndMarks(t *testing.T) {
	dir := t.TempDir()
	// A frozen clock: the bucket never refills, so after the burst (at
	// least one 64 KiB read) everything is dropped.
	frozen := time.Unix(100, 0)
	flood := strings.Repeat(strings.Repeat("x", 1023)+"\n", 1024) // 1 MiB
	r := io.MultiReader(strings.NewReader(flood))
	if err := Write(WriterSpec{Dir: dir, Limit: Limit{BytesPerSecond: 1024, Burst: 1}}, [2]io.Reader{onebyone{r}, strings.NewReader("")},
		func() {}, func() time.Time { return frozen }); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(DataPath(dir, Stdout))
	if len(b) >= len(flood) {
		t.Fatalf("kept %d bytes of a %d-byte flood past its limit", len(b), len(flood))
	}
	i := bytes.Index(b, []byte("[warmfleet: "))
	if i < 0 {
		t.Fatalf("no drop marker in %q...", b[:min(len(b), 200)])
	}
	var dropped int64
	if _, err := fmt.Sscanf(string(b[i:]), "[warmfleet: %d bytes of stdout dropped", &dropped); err != nil {
		t.Fatal(err)
	}
	if kept := int64(i); kept+dropped != int64(len(flood)) {
		t.Fatalf("kept %d + dropped %d != written %d", kept, dropped, len(flood))
	}
	tl := NewTail(dir, Stdout, 0)
	defer tl.Close()
	var total int64
	for {
		c, ok, err := tl.Next(64<<10, true, frozen)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		total += c.Dropped
	}
	if total != dropped {
		t.Fatalf("times index says %d bytes dropped, the marker %d", total, dropped)
	}
}

// onebyone hands out 64 KiB reads, as a pipe does.
type onebyone struct{ r io.Reader }

func (o onebyone) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 64<<10)]) }

func TestTailShipsWholeLines(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Unix(100, 0)}
	long := strings.Repeat("y", 100)
	write(t, WriterSpec{Dir: dir}, "a\nbb\n"+long+"\npartial", "", c)
	tl := NewTail(dir, Stdout, 0)
	defer tl.Close()
	now := time.Unix(200, 0)
	var got []string
	for {
		ch, ok, err := tl.Next(64, false, now)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, string(ch.Data))
		if ch.At.IsZero() {
			t.Fatalf("chunk at %d has no time", ch.Offset)
		}
	}
	want := []string{"a\nbb\n", long[:64], long[64:] + "\n"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("chunks %q, want %q", got, want)
	}
	// The partial line waits for its newline, then ships after PartialAfter
	// or when the writer is done.
	if _, ok, _ := tl.Next(64, false, now.Add(PartialAfter/2)); ok {
		t.Fatal("a partial line shipped before PartialAfter")
	}
	ch, ok, _ := tl.Next(64, false, now.Add(PartialAfter))
	if !ok || string(ch.Data) != "partial" {
		t.Fatalf("partial after waiting: %q %v", ch.Data, ok)
	}
}

func TestJournalResumesUnackedSpans(t *testing.T) {
	dir := t.TempDir()
	j, st, err := OpenJournal(dir)
	if err != nil || st[Stdout].Next != 0 {
		t.Fatal(err, st)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(j.Intent(Stdout, Span{0, 10}))
	must(j.Intent(Stdout, Span{10, 25}))
	must(j.Acked(Stdout, 10))
	must(j.Intent(Stderr, Span{0, 5}))
	must(j.Acked(Stderr, 5))
	must(j.Ended(Stderr, 5))
	j.Close()
	// A torn record at the end is dropped.
	f, _ := os.OpenFile(dir+"/"+journalFile, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{recIntent, 0, 1})
	f.Close()
	j, st, err = OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if o := st[Stdout]; o.Acked != 10 || len(o.Unacked) != 1 || o.Unacked[0] != (Span{10, 25}) || o.Next != 25 || o.Ended {
		t.Fatalf("stdout %+v", o)
	}
	if e := st[Stderr]; !e.Ended || e.Length != 5 || len(e.Unacked) != 0 {
		t.Fatalf("stderr %+v", e)
	}
	must(j.Intent(Stdout, Span{25, 30}))
}

func TestParseJournalRefusesGaps(t *testing.T) {
	var b []byte
	rec := func(kind byte, s Stream, a, e int64) {
		var r [recSize]byte
		r[0], r[1] = kind, byte(s)
		for i := range 8 {
			r[2+i] = byte(a >> (8 * i))
			r[10+i] = byte(e >> (8 * i))
		}
		b = append(b, r[:]...)
	}
	rec(recIntent, Stdout, 0, 10)
	rec(recIntent, Stdout, 20, 30)
	if _, _, err := ParseJournal(b); !errors.Is(err, ErrCorruptJournal) {
		t.Fatalf("a gap between intents: %v", err)
	}
}

func TestWriterSpecRoundTrip(t *testing.T) {
	in := WriterSpec{Dir: "/var/lib/warmfleet/logs/r-1-a1", Limit: Limit{BytesPerSecond: 1 << 20, Burst: 4 << 20}}
	out, err := ParseWriterSpec(in.Encode())
	if err != nil || out != in {
		t.Fatalf("%+v %v", out, err)
	}
	for _, bad := range []string{"", "dir=relative", "dir=/x&rate=-1", "dir=/x&burst=lots", "%zz"} {
		if _, err := ParseWriterSpec(bad); !errors.Is(err, ErrBadWriterSpec) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func FuzzParseJournal(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{recIntent, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, used, err := ParseJournal(b)
		if used > len(b) || used%recSize != 0 {
			t.Fatalf("used %d of %d", used, len(b))
		}
		if err == nil {
			for _, s := range st {
				if s.Acked > s.Next {
					t.Fatalf("acked %d past next %d", s.Acked, s.Next)
				}
			}
		}
	})
}

func FuzzParseWriterSpec(f *testing.F) {
	f.Add("dir=%2Fx&rate=1&burst=2")
	f.Add("dir=/x")
	f.Fuzz(func(t *testing.T, arg string) {
		s, err := ParseWriterSpec(arg)
		if err != nil {
			return
		}
		again, err := ParseWriterSpec(s.Encode())
		if err != nil || again != s {
			t.Fatalf("%q: %+v does not round-trip: %+v %v", arg, s, again, err)
		}
	})
}
