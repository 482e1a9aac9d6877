package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/placement"
)

func TestZZDebug(t *testing.T) {
	name := os.Getenv("ZZ_TRACE")
	if name == "" {
		t.Skip()
	}
	cfg := placement.DefaultConfig()
	cfg.GPUHourPrice = -1
	for _, p := range []simPolicy{warmfleetPolicy{cfg: cfg}, imageLocalityPolicy{}, randomPolicy{}} {
		tr := shortTrace(t, name, 2000)
		s := newSimulator(tr, p, cfg)
		if err := s.run(context.Background()); err != nil {
			t.Fatal(err)
		}
		gh := map[int]float64{}
		cold := map[int]int{}
		own := map[int]float64{}
		for i, st := range s.state {
			r := s.runs[i]
			w := st.runningAt - st.cardsAt
			gh[r.gpus] += float64(r.gpus) * w / 3600
			if w > 0 {
				cold[r.gpus]++
				own[r.gpus] += float64(r.gpus) * (float64(st.pulled)*(1/tr.Fleet.PullBytesPerSecond+1/tr.Fleet.UnpackBytesPerSecond) + float64(st.fetch)/tr.Fleet.ArtifactBytesPerSecond) / 3600
			}
		}
		fmt.Printf("%-15s", p.name())
		for _, g := range []int{1, 2, 4, 8} {
			fmt.Printf("  g%d: gh %.2f own %.2f cold %d", g, gh[g], own[g], cold[g])
		}
		fmt.Println()
	}
}
