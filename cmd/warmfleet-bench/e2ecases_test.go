package main

import (
	"slices"
	"strings"
	"testing"
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
