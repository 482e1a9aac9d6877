package main

import (
	"fmt"
	"io"
	"time"
)

// floodReader hands out floodLine, numbered, at most 64 KiB a read (as a
// pipe does) and at most rate bytes a second, until its time or its bytes
// run out.
type floodReader struct {
	buf   []byte
	pos   int
	start time.Time
	until time.Time
	rate  float64
	read  int64
	left  int64
}

func newFloodReader(d time.Duration, limit int64, rate float64) *floodReader {
	var b []byte
	for i := range 1 << 15 { // 3.2 MB of lines, numbered
		b = append(b, fmt.Sprintf("flood step=%06d%s\n", i, floodLine[len("flood step=000000"):])...)
	}
	now := time.Now()
	return &floodReader{buf: b, start: now, until: now.Add(d), rate: rate, left: limit}
}

func (f *floodReader) Read(p []byte) (int, error) {
	if f.left <= 0 || time.Now().After(f.until) {
		return 0, io.EOF
	}
	if ahead := time.Duration(float64(f.read)/f.rate*float64(time.Second)) - time.Since(f.start); ahead > 0 {
		time.Sleep(ahead)
	}
	p = p[:min(int64(len(p)), f.left, 64<<10)]
	n := 0
	for n < len(p) {
		c := copy(p[n:], f.buf[f.pos:])
		n += c
		f.pos = (f.pos + c) % len(f.buf)
	}
	f.left -= int64(n)
	f.read += int64(n)
	return n, nil
}
