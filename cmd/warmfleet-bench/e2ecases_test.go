package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzSizedCases: --cases is accepted only when every name is a case, and
// then exactly the named cases run (all three when none is named).
func FuzzSizedCases(f *testing.F) {
	for _, s := range []string{"warm", "warm,cold", "", "partial,partial", "hot", "warm,", "WARM"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o := sizedOpts{runs: 1, imageMiB: 6, layers: 6, baseLayers: 4, artifactMiB: 1, links: "100"}
		if s != "" {
			o.cases = strings.Split(s, ",")
		}
		err := o.check()
		for _, c := range o.cases {
			if !slices.Contains(sizedCases, c) {
				if err == nil {
					t.Fatalf("%q: %q accepted", s, c)
				}
				return
			}
		}
		if err != nil {
			t.Fatalf("%q refused: %v", s, err)
		}
		for _, c := range sizedCases {
			if want := len(o.cases) == 0 || slices.Contains(o.cases, c); o.has(c) != want {
				t.Fatalf("%q: has(%s) = %v", s, c, !want)
			}
		}
	})
}

// TestPairedRatio: each Run is divided by the floor measured beside it,
// so a burst that slows both sides of one pair leaves the ratio alone.
func TestPairedRatio(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		total, floor []time.Duration
		want         float64
	}{
		{ms(110, 220, 1100), ms(100, 200, 1000), 1.1},
		{ms(100, 300), ms(100, 200), 1.25},
		{ms(100), ms(0), 0},
		{nil, nil, 0},
	} {
		c := &sizedCase{total: tc.total, floor: tc.floor}
		if got := c.pairedRatio(); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("total %v floor %v: %v, want %v", tc.total, tc.floor, got, tc.want)
		}
	}
}
