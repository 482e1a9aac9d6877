package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/placement"
	"github.com/warmfleet/warmfleet/controlplane/queue"
)

// shortTrace is a committed corpus trace cut to runs Runs, so a test runs
// the real corpus's fleet and catalogue in well under a second.
func shortTrace(t *testing.T, name string, runs int) *simTrace {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "traces", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := decodeTrace(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr.Workload.Runs = runs
	return tr
}

func TestPlacementSimCorpusDecodes(t *testing.T) {
	traces, err := loadTraces(nil, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tr := range traces {
		names[tr.Name] = true
	}
	for _, want := range []string{"zipf", "huge-images", "artifact-heavy", "bursty", "bursts-over"} {
		if !names[want] {
			t.Errorf("corpus lacks trace %q (has %v)", want, names)
		}
	}
}

// TestPlacementSimDeterministic: the same trace and seed give the same
// result, for the policy that draws at random too; another seed does not.
func TestPlacementSimDeterministic(t *testing.T) {
	cfg := placement.DefaultConfig()
	for _, p := range []simPolicy{warmfleetPolicy{cfg: cfg}, randomPolicy{}} {
		var got []simResult
		for range 2 {
			s := newSimulator(shortTrace(t, "bursty", 120), p, cfg)
			if err := s.run(context.Background()); err != nil {
				t.Fatal(err)
			}
			got = append(got, s.result())
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Errorf("%s: two runs of one trace differ:\n%+v\n%+v", p.name(), got[0], got[1])
		}
		other := shortTrace(t, "bursty", 120)
		other.Seed++
		s := newSimulator(other, p, cfg)
		if err := s.run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(got[0], s.result()) {
			t.Errorf("%s: another seed gave the same result", p.name())
		}
	}
}

// TestImageLocalityScore checks the reimplementation against values worked
// by hand from Kubernetes' formula: score = 100 × (clamp(Σ size × holders /
// nodes) − 23 MiB) / (1000 MiB × containers − 23 MiB), integer division.
func TestImageLocalityScore(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name    string
		sizes   []int64
		holders []int
		nodes   int
		held    []bool
		want    int64
	}{
		// 500 MiB × 5/10 = 250 MiB: 100 × 227 MiB / 977 MiB = 23.23.
		{"half the fleet holds 500 MiB", []int64{500 * mib}, []int{5}, 10, []bool{true}, 23},
		// A rare 10 GiB image on 1 of 16 nodes: 640 MiB: 100 × 617 / 977 = 63.15.
		{"one node holds a rare 10 GiB image", []int64{10240 * mib}, []int{1}, 16, []bool{true}, 63},
		// On every node: clamped to 1000 MiB: 100.
		{"every node holds 2 GiB", []int64{2048 * mib}, []int{8}, 8, []bool{true}, 100},
		// 20 MiB is below minThreshold: 0.
		{"small image", []int64{20 * mib}, []int{4}, 4, []bool{true}, 0},
		{"not held", []int64{500 * mib}, []int{5}, 10, []bool{false}, 0},
		// Two containers: 800 MiB + (600 MiB × 1/2 not held) = 800 MiB:
		// 100 × 777 / (2000 − 23) = 39.30.
		{"two containers, one held", []int64{800 * mib, 600 * mib}, []int{4, 2}, 4, []bool{true, false}, 39},
	} {
		if got := imageLocalityScore(c.sizes, c.holders, c.nodes, c.held); got != c.want {
			t.Errorf("%s: score %d, want %d", c.name, got, c.want)
		}
	}
}

// TestPlacementSimPullChargesOnlyMissingLayers: a node holding one image
// of a base fetches only the other image's own layers, timed at the link's
// bandwidth and then the unpack rate; an image it holds costs nothing.
func TestPlacementSimPullChargesOnlyMissingLayers(t *testing.T) {
	tr := shortTrace(t, "zipf", 2)
	s := newSimulator(tr, randomPolicy{}, placement.DefaultConfig())
	// Two Runs of two images over the same base.
	a, b := 0, 1
	if s.cat.images[a].layers[1] != s.cat.images[b].layers[1] {
		t.Fatal("the first two images of the zipf trace should share their base")
	}
	s.runs[0].image, s.runs[0].artifact = a, -1
	s.runs[1].image, s.runs[1].artifact = b, -1
	n := s.nodes[0]
	_, pulledA, _ := s.fetch(n, 0, 0)
	var sumA int64
	for _, l := range s.cat.images[a].layers {
		sumA += s.cat.layerBytes[l]
	}
	if pulledA != sumA {
		t.Fatalf("cold node pulled %d bytes of image A, want all %d", pulledA, sumA)
	}
	now := 1e6 // long after A arrived
	readyB, pulledB, _ := s.fetch(n, 1, now)
	var own int64
	for _, l := range s.cat.images[b].layers {
		if !containsInt(s.cat.images[a].layers, l) {
			own += s.cat.layerBytes[l]
		}
	}
	if pulledB != own || own == 0 {
		t.Fatalf("pulled %d bytes of image B beside A, want only its own layers' %d", pulledB, own)
	}
	f := tr.Fleet
	// The last own layer finishes unpacking after every own byte crossed the
	// link and its own bytes were unpacked.
	last := s.cat.layerBytes[s.cat.images[b].layers[len(s.cat.images[b].layers)-1]]
	if want := now + float64(own)/f.PullBytesPerSecond + float64(last)/f.UnpackBytesPerSecond; readyB < want-1e-6 || readyB > now+float64(own)/f.PullBytesPerSecond+float64(own)/f.UnpackBytesPerSecond+1e-6 {
		t.Errorf("B ready at %.2f s, want between %.2f and the serial bound", readyB, want)
	}
	s.runs[1].image = a
	readyA, pulled, _ := s.fetch(n, 1, now)
	if pulled != 0 || readyA != now {
		t.Errorf("held image: pulled %d bytes, ready at %v; want 0 bytes, at once", pulled, readyA)
	}
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestPlacementSimRunsEveryRun: each policy places and finishes every Run
// of a short trace, nothing starts before it arrives, and cards are never
// held twice.
func TestPlacementSimRunsEveryRun(t *testing.T) {
	cfg := placement.DefaultConfig()
	for _, p := range simPolicies(cfg) {
		s := newSimulator(shortTrace(t, "artifact-heavy", 200), p, cfg)
		if err := s.run(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i, st := range s.state {
			if !st.done || st.runningAt < s.runs[i].arrival || st.cardsAt < s.runs[i].arrival || len(st.cards) != s.runs[i].gpus {
				t.Fatalf("%s: run %d: %+v (arrived %v)", p.name(), i, st, s.runs[i].arrival)
			}
		}
		for _, n := range s.nodes {
			if n.freeCards() != len(n.cards) || len(n.running) != 0 || len(n.queued) != 0 {
				t.Errorf("%s: %s ends with cards held or Runs booked", p.name(), n.id)
			}
		}
	}
}

func TestDecodeTraceRefuses(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "traces", "zipf.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{
		"unknown field": `{"name":"x","surprise":1}`,
		"empty":         ``,
		"trailing":      string(good) + `{}`,
		"no nodes":      string(bytes.Replace(good, []byte(`"nodes": 16`), []byte(`"nodes": 0`), 1)),
		"watermarks":    string(bytes.Replace(good, []byte(`"low_watermark_percent": 70`), []byte(`"low_watermark_percent": 90`), 1)),
		"gpus too many": string(bytes.Replace(good, []byte(`"count": 8, "weight": 0.1`), []byte(`"count": 9, "weight": 0.1`), 1)),
		"unknown base":  string(bytes.Replace(good, []byte(`"base": "cuda-jax"`), []byte(`"base": "nope"`), 1)),
	} {
		if _, err := decodeTrace(bytes.NewReader([]byte(in))); !errors.Is(err, errTrace) {
			t.Errorf("%s: err %v, want errTrace", name, err)
		}
	}
	if _, err := decodeTrace(bytes.NewReader(good)); err != nil {
		t.Fatalf("zipf: %v", err)
	}
}

// FuzzDecodeTrace: any input is refused with errTrace or decodes to a
// trace that expands to exactly its Runs, in arrival order, each within
// the fleet.
func FuzzDecodeTrace(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "traces", "*.json"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := decodeTrace(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, errTrace) {
				t.Fatalf("error %v is not errTrace", err)
			}
			return
		}
		if tr.Workload.Runs > 5000 || len(tr.Images) > 100 {
			return // valid, but too big to expand on every fuzz input
		}
		cat, runs := tr.expand()
		if len(runs) != tr.Workload.Runs {
			t.Fatalf("%d runs, want %d", len(runs), tr.Workload.Runs)
		}
		for i, r := range runs {
			if i > 0 && r.arrival < runs[i-1].arrival {
				t.Fatalf("run %d arrives before run %d", i, i-1)
			}
			if r.image < 0 || r.image >= len(cat.images) || r.artifact >= len(cat.artifacts) || r.gpus < 1 || r.gpus > tr.Fleet.GPUsPerNode {
				t.Fatalf("run %d out of range: %+v", i, r)
			}
		}
	})
}

// TestPlacementSimFloorBytes: one node that never collects pulls exactly
// the floor (each distinct layer and artifact once); a fleet pulls no less.
func TestPlacementSimFloorBytes(t *testing.T) {
	cfg := placement.DefaultConfig()
	for _, nodes := range []int{1, 16} {
		tr := shortTrace(t, "artifact-heavy", 150)
		tr.Fleet.Nodes, tr.Fleet.DiskBytes = nodes, 1<<50
		floor := tr.floorBytes()
		s := newSimulator(tr, randomPolicy{}, cfg)
		if err := s.run(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := s.result()
		switch got := r.BytesPulled(); {
		case floor == 0 || r.ArtifactBytes == 0:
			t.Fatalf("%d node(s): floor %d, artifact bytes %d: the trace should pull both images and artifacts", nodes, floor, r.ArtifactBytes)
		case nodes == 1 && got != floor:
			t.Errorf("one node pulled %d bytes, want the floor %d", got, floor)
		case got < floor:
			t.Errorf("%d nodes pulled %d bytes, below the floor %d", nodes, got, floor)
		}
	}
}

// TestPlacementSimReseed: each reseeded copy keeps the trace's shape, has
// its own name and seed, and draws another workload.
func TestPlacementSimReseed(t *testing.T) {
	base := shortTrace(t, "zipf", 50)
	got := withSeeds([]*simTrace{base}, 2)
	if len(got) != 3 || got[0] != base || got[1].Name != "zipf-s1" || got[2].Name != "zipf-s2" || got[2].Seed != base.Seed*1000+2 {
		t.Fatalf("reseeded traces: %d, names/seeds %v", len(got), []any{got[1].Name, got[2].Name, got[2].Seed})
	}
	_, a := base.expand()
	_, b := got[1].expand()
	if len(a) != len(b) || reflect.DeepEqual(a, b) {
		t.Errorf("seed %d drew the same %d Runs as seed %d", got[1].Seed, len(b), base.Seed)
	}
	if base.Name != "zipf" || base.Seed == got[1].Seed {
		t.Errorf("the original trace changed: %s seed %d", base.Name, base.Seed)
	}
}

// TestPlacementSimRedecisionRule: a pass decides a waiting Run again only
// when the fleet changed since its last decision, and once a Run of a
// shape finds no node, no other Run of that shape is decided in the pass.
func TestPlacementSimRedecisionRule(t *testing.T) {
	cfg := placement.DefaultConfig()
	for _, p := range []simPolicy{warmfleetPolicy{cfg: cfg}, binPackPolicy{}} {
		s := newSimulator(shortTrace(t, "bursts-over", 200), p, cfg)
		shapes := map[queue.Shape]bool{}
		for i := range s.runs {
			s.waiting = append(s.waiting, i) // the whole burst arrives at once
			shapes[s.shapes[i]] = true
		}
		s.pass(0)
		booked := func() int { return len(s.runs) - len(s.waiting) }
		if booked() == 0 || len(s.waiting) == 0 {
			t.Fatalf("%s: %d booked, %d waiting: the burst should overflow the fleet", p.name(), booked(), len(s.waiting))
		}
		if s.decisions > booked()+len(shapes) {
			t.Errorf("%s: %d decisions for %d bookings and %d shapes", p.name(), s.decisions, booked(), len(shapes))
		}
		before := s.decisions
		s.pass(0)
		if s.decisions != before {
			t.Errorf("%s: a pass over an unchanged fleet made %d decisions", p.name(), s.decisions-before)
		}
		// warmfleet books the cold Runs to fetch first: they start once
		// their bytes are there.
		ready := math.Inf(1)
		for _, st := range s.state {
			if st.node >= 0 {
				ready = min(ready, st.readyAt)
			}
		}
		s.pass(ready)
		run := -1
		for _, n := range s.nodes {
			if len(n.running) > 0 {
				run = n.running[0]
				break
			}
		}
		if run < 0 {
			t.Fatalf("%s: nothing runs once the first bytes are there", p.name())
		}
		before = s.decisions
		s.end(run, ready+1)
		had := booked()
		s.pass(ready + 1)
		if got, most := s.decisions-before, booked()-had+len(shapes); got == 0 || got > most {
			t.Errorf("%s: after a Run ended, %d decisions (want 1..%d)", p.name(), got, most)
		}
	}
}

// TestPlacementSimFetchFirst: warmfleet books a Run whose bytes its node
// lacks to fetch them first. It takes its cards when they are there, its
// cards kept free meanwhile count as waiting on its pull as held cards do.
// A baseline holds its cards from booking.
func TestPlacementSimFetchFirst(t *testing.T) {
	cfg := placement.DefaultConfig()
	for _, p := range []simPolicy{warmfleetPolicy{cfg: cfg}, binPackPolicy{}} {
		tr := shortTrace(t, "zipf", 1)
		tr.Fleet.Nodes = 1
		s := newSimulator(tr, p, cfg)
		s.runs[0].gpus = 2
		s.waiting = []int{0}
		started, fetching := s.pass(0)
		st := s.state[0]
		if st.readyAt <= 0 {
			t.Fatalf("%s: the Run's bytes are there at once (%v): the node should lack them", p.name(), st.readyAt)
		}
		first := p.name() == "warmfleet"
		if st.fetchFirst != first || (len(started) == 0) == !first || (len(fetching) == 1) != first || (st.cards == nil) != first {
			t.Fatalf("%s: fetch first %v, started %v, fetching %v, cards %v", p.name(), st.fetchFirst, started, fetching, st.cards)
		}
		if free := s.nodes[0].freeCards(); first && free != len(s.nodes[0].cards) {
			t.Errorf("%s: %d cards free while the Run fetches, want all", p.name(), free)
		}
		s.keep(st.readyAt)
		if first {
			s.pass(st.readyAt)
		}
		if st := s.state[0]; st.cards == nil || st.runningAt != st.readyAt {
			t.Fatalf("%s: at its bytes' arrival (%v) cards %v running at %v", p.name(), st.readyAt, st.cards, st.runningAt)
		}
		s.end(0, st.readyAt+1)
		r := s.result()
		want := 2 * st.readyAt / 3600
		if math.Abs(r.GPUHoursPullWait-want) > 1e-9 || (r.GPUHoursKept > 0) != first {
			t.Errorf("%s: GPU-h waiting on the pull %v (kept %v), want %v", p.name(), r.GPUHoursPullWait, r.GPUHoursKept, want)
		}
	}
}
