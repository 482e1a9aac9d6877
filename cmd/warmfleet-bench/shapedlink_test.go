package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The link's own correctness: bytes through it arrive whole, at about its
// rate (generous bounds: the machine is shared), and a second transfer at
// once shares the one bucket.
func TestShapedLinkPacesToItsRate(t *testing.T) {
	l, err := newShapedLink(80) // 10 MB/s
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 5 << 20
	took, err := measureLink(ctx, l, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := float64(n) / took.Seconds() / l.bytesPerSecond(); got > 1.1 || got < 0.5 {
		t.Fatalf("%d bytes in %s: %.2f of the link's rate", n, took, got)
	}
	errs := make(chan error, 2)
	times := make(chan time.Duration, 2)
	for range 2 {
		go func() {
			d, err := measureLink(ctx, l, n)
			errs <- err
			times <- d
		}()
	}
	var longest time.Duration
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		longest = max(longest, <-times)
	}
	// Two at once move 2n bytes through one bucket.
	if got := 2 * float64(n) / longest.Seconds() / l.bytesPerSecond(); got > 1.1 || got < 0.5 {
		t.Fatalf("two transfers of %d bytes in %s: %.2f of the link's rate", n, longest, got)
	}
}

func TestParseLinks(t *testing.T) {
	got, err := parseLinks("1000, 100")
	if err != nil || len(got) != 2 || got[0] != 1000 || got[1] != 100 {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "fast", "100,", "-1", "1000000"} {
		if _, err := parseLinks(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// FuzzParseLinks: --link either is refused or yields one speed in range per
// comma-separated field.
func FuzzParseLinks(f *testing.F) {
	for _, s := range []string{"1000,100", "1", " 100 ", "0", "1,,2", "1e3", "-5", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseLinks(s)
		if err != nil {
			return
		}
		if len(got) != strings.Count(s, ",")+1 {
			t.Fatalf("%q: %v", s, got)
		}
		for _, v := range got {
			if v < 1 || v > 100_000 {
				t.Fatalf("%q: %d out of range", s, v)
			}
		}
	})
}
