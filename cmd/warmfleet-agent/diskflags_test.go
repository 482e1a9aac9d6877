package main

import (
	"strings"
	"testing"
)

func TestDiskWatermarkFlags(t *testing.T) {
	for _, tc := range []struct {
		high, low int
		off       bool
		err       string
	}{
		{high: 85, low: 70},
		{high: 0, low: 0, off: true},
		{high: 70, low: 85, err: "must be below the high watermark"},
		{high: 80, low: 80, err: "must be below the high watermark"},
		{high: 100, low: 70, err: "outside 1..99"},
		{high: 85, low: 0, err: "outside 1..99"},
		{high: 0, low: 70, err: "outside 1..99"},
	} {
		w, err := diskWatermarks(tc.high, tc.low)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--disk-high-watermark") {
				t.Errorf("%d/%d: err %v, want one naming the flags and %q", tc.high, tc.low, err, tc.err)
			}
		case err != nil:
			t.Errorf("%d/%d: %v", tc.high, tc.low, err)
		case tc.off != (w == nil):
			t.Errorf("%d/%d: watermarks %+v, want off %v", tc.high, tc.low, w, tc.off)
		case w != nil && (w.High != tc.high || w.Low != tc.low):
			t.Errorf("%d/%d: watermarks %+v", tc.high, tc.low, w)
		}
	}
}
