package runlog

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/warmfleet/warmfleet/bus"
)

func at(s int) time.Time { return time.Unix(1_800_000_000+int64(s), 0).UTC() }

func chunk(attempt, stream string, off int64, sec int, data string) Chunk {
	return Chunk{Attempt: attempt, Node: "n1", Stream: stream, Offset: off, Time: at(sec), Data: []byte(data)}
}

func endOf(attempt, stream string, length int64) Chunk {
	return Chunk{Attempt: attempt, Stream: stream, End: true, Length: length, Offset: length}
}

func collect(t *testing.T, chunks ...Chunk) []Line {
	t.Helper()
	var r Reassembler
	var out []Line
	add := func(l Line) error { out = append(out, l); return nil }
	for _, c := range chunks {
		if err := r.Add(c, add); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(add); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReassembler(t *testing.T) {
	const a1, a2 = "r-1-a1", "r-1-a2"
	out := collect(t,
		chunk(a1, bus.LogStdout, 0, 1, "one\ntwo\n"),
		chunk(a1, bus.LogStderr, 0, 2, "oops\n"),
		chunk(a1, bus.LogStdout, 0, 1, "one\ntwo\n"),     // stored twice
		chunk(a1, bus.LogStdout, 4, 3, "two\nthree\nfo"), // overlaps, ends mid-line
		chunk(a1, bus.LogStdout, 16, 4, "ur\nfi"),
		chunk(a1, bus.LogStdout, 21, 5, "ve"),
		endOf(a1, bus.LogStdout, 23),              // the trailing partial line
		chunk(a1, bus.LogStdout, 8, 3, "three\n"), // after the end: had already
		endOf(a1, bus.LogStdout, 23),
		chunk(a2, bus.LogStdout, 0, 6, "again\nno newline"), // flushed at the end
	)
	want := []Line{
		{a1, "n1", bus.LogStdout, at(1), "one", false},
		{a1, "n1", bus.LogStdout, at(1), "two", false},
		{a1, "n1", bus.LogStderr, at(2), "oops", false},
		{a1, "n1", bus.LogStdout, at(3), "three", false},
		{a1, "n1", bus.LogStdout, at(3), "four", false},
		{a1, "n1", bus.LogStdout, at(4), "five", true},
		{a2, "n1", bus.LogStdout, at(6), "again", false},
		{a2, "n1", bus.LogStdout, at(6), "no newline", true},
	}
	if !slices.Equal(out, want) {
		t.Fatalf("got\n%v\nwant\n%v", out, want)
	}
}

// A stream first seen mid-way starts there; a jump forward (bytes no
// longer stored) ends the partial line before it.
func TestReassemblerGaps(t *testing.T) {
	out := collect(t,
		chunk("r-1-a1", bus.LogStdout, 100, 1, "late\npart"),
		chunk("r-1-a1", bus.LogStdout, 200, 2, "after a gap\n"),
		chunk("r-1-a1", bus.LogStdout, 105, 1, "part"), // within what was skipped over
	)
	var texts []string
	for _, l := range out {
		texts = append(texts, l.Text)
	}
	if want := []string{"late", "part", "after a gap"}; !slices.Equal(texts, want) {
		t.Fatalf("got %q, want %q", texts, want)
	}
}

func TestReassemblerLongLine(t *testing.T) {
	long := strings.Repeat("x", bus.MaxLogChunk)
	var chunks []Chunk
	for i := range maxLine/bus.MaxLogChunk + 1 {
		chunks = append(chunks, chunk("r-1-a1", bus.LogStdout, int64(i*bus.MaxLogChunk), i, long))
	}
	out := collect(t, chunks...)
	if len(out) != 2 || len(out[0].Text) != maxLine || len(out[1].Text) != bus.MaxLogChunk || !out[0].Time.Equal(at(0)) {
		t.Fatalf("%d lines", len(out))
	}
	if !out[0].Partial || !out[1].Partial {
		t.Fatalf("a line cut at maxLine and one without its newline are not partial: %v, %v", out[0].Partial, out[1].Partial)
	}
}

// bytesOf puts lines back as a stream's bytes: each Text, and "\n" after
// each that is not Partial.
func bytesOf(lines []Line) []byte {
	var b []byte
	for _, l := range lines {
		b = append(b, l.Text...)
		if !l.Partial {
			b = append(b, '\n')
		}
	}
	return b
}

// Byte for byte: binary bytes, invalid UTF-8, a line over maxLine split
// across chunks of any size, and a last line without its newline come back
// as written, and the split says where it is.
func TestReassemblerByteExact(t *testing.T) {
	content := []byte("\x00\x01\xff\xfe binary\n\xc3\x28 not utf-8\n")
	content = append(content, bytes.Repeat([]byte("y"), 2*maxLine+17)...)
	content = append(content, "\nno final newline"...)
	for _, size := range []int{1031, bus.MaxLogChunk, maxLine + 3} {
		var chunks []Chunk
		for off := 0; off < len(content); off += size {
			chunks = append(chunks, chunk("r-1-a1", bus.LogStdout, int64(off), 0, string(content[off:min(off+size, len(content))])))
		}
		chunks = append(chunks, endOf("r-1-a1", bus.LogStdout, int64(len(content))))
		out := collect(t, chunks...)
		if got := bytesOf(out); !bytes.Equal(got, content) {
			t.Fatalf("chunks of %d: %d bytes back, %d written (first difference at %d)", size, len(got), len(content), firstDiff(got, content))
		}
		var split int
		for _, l := range out {
			if l.Partial {
				split++
			}
		}
		if split < 2 || !out[len(out)-1].Partial || out[len(out)-1].Text != "no final newline" {
			t.Fatalf("chunks of %d: %d partial lines, want the long line's cut(s) and the last line", size, split)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Gaps: a stream's missing first bytes (when reading from the start) and
// a jump forward are told, once each.
func TestReassemblerTellsGaps(t *testing.T) {
	var gaps []Gap
	r := Reassembler{FromStart: true, Gaps: func(g Gap) { gaps = append(gaps, g) }}
	add := func(Line) error { return nil }
	for _, c := range []Chunk{
		chunk("r-1-a1", bus.LogStdout, 100, 1, "late\n"),
		chunk("r-1-a1", bus.LogStdout, 105, 1, "next\n"),
		chunk("r-1-a1", bus.LogStdout, 200, 2, "after a gap\n"),
		chunk("r-1-a1", bus.LogStderr, 0, 2, "whole\n"),
	} {
		if err := r.Add(c, add); err != nil {
			t.Fatal(err)
		}
	}
	want := []Gap{{"r-1-a1", bus.LogStdout, 0, 100}, {"r-1-a1", bus.LogStdout, 110, 200}}
	if !slices.Equal(gaps, want) {
		t.Fatalf("gaps %v, want %v", gaps, want)
	}
}

// Any run of chunks that covers a stream without gaps, resending or
// re-cutting what came before, yields the stream's lines once each.
func TestReassemblerProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		content := []byte(rapid.StringOfN(rapid.SampledFrom([]rune("ab\n")), 0, 200, -1).Draw(t, "content"))
		var chunks []Chunk
		end := 0 // how far the chunks so far reach
		for end < len(content) {
			from := rapid.IntRange(0, end).Draw(t, "from") // resends from anywhere up to end
			to := rapid.IntRange(max(from, end)+1, len(content)).Draw(t, "to")
			if rapid.Bool().Draw(t, "resend") {
				to = rapid.IntRange(from, end).Draw(t, "to-old")
			}
			chunks = append(chunks, chunk("r-1-a1", bus.LogStdout, int64(from), 0, string(content[from:to])))
			end = max(end, to)
		}
		if rapid.Bool().Draw(t, "end") {
			chunks = append(chunks, endOf("r-1-a1", bus.LogStdout, int64(len(content))))
		}
		var r Reassembler
		var got []string
		add := func(l Line) error { got = append(got, l.Text); return nil }
		for _, c := range chunks {
			_ = r.Add(c, add)
		}
		_ = r.Flush(add)
		var want []string
		for _, l := range bytes.SplitAfter(content, []byte("\n")) {
			if len(l) > 0 {
				want = append(want, strings.TrimSuffix(string(l), "\n"))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("got %q, want %q", got, want)
		}
	})
}

// FuzzReassemble: whatever the bytes and however they are cut into chunks
// (some sent twice), the lines, each "\n"-ended unless Partial, are the
// bytes.
func FuzzReassemble(f *testing.F) {
	f.Add([]byte("one\ntwo\n"), []byte{3})
	f.Add([]byte("\x00\xff\xfe\n\xc3\x28 no newline"), []byte{1, 5, 2})
	f.Add([]byte("\n\n\nabc"), []byte{0, 1})
	f.Fuzz(func(t *testing.T, content, cuts []byte) {
		if len(cuts) == 0 {
			cuts = []byte{16}
		}
		var r Reassembler
		var out []Line
		add := func(l Line) error { out = append(out, l); return nil }
		for off, i := 0, 0; off < len(content); i++ {
			n := int(cuts[i%len(cuts)])
			if n%8 == 0 { // first, a resend of up to 7 bytes before
				from := max(off-1-n/8%7, 0)
				_ = r.Add(chunk("r-1-a1", bus.LogStdout, int64(from), 0, string(content[from:off])), add)
			}
			end := min(off+1+n%64, len(content))
			_ = r.Add(chunk("r-1-a1", bus.LogStdout, int64(off), 0, string(content[off:end])), add)
			off = end
		}
		_ = r.Add(endOf("r-1-a1", bus.LogStdout, int64(len(content))), add)
		if got := bytesOf(out); !bytes.Equal(got, content) {
			t.Fatalf("%q cut by %v came back as %q", content, cuts, got)
		}
	})
}
