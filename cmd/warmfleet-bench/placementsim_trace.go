package main

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
)

// The committed trace corpus placement-sim runs by default.
//
//go:embed testdata/traces/*.json
var traceCorpus embed.FS

// simTrace is one trace file: a fleet, an image and artifact catalogue, and
// a workload the simulator expands, deterministically from Seed, into Runs.
// The format is documented in docs/benchmarks.md (section 8).
type simTrace struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Seed        uint64          `json:"seed"`
	Fleet       simFleetSpec    `json:"fleet"`
	Bases       []simBaseSpec   `json:"bases"`
	Images      []simImageGroup `json:"images"`
	Artifacts   []simArtGroup   `json:"artifacts"`
	Workload    simWorkload     `json:"workload"`
}

// simFleetSpec is N identical GPU nodes and how fast bytes reach them.
type simFleetSpec struct {
	Nodes       int   `json:"nodes"`
	GPUsPerNode int   `json:"gpus_per_node"`
	DiskBytes   int64 `json:"disk_bytes"`
	// PullBytesPerSecond is each node's registry link; layers a node
	// fetches share it one after another.
	PullBytesPerSecond float64 `json:"pull_bytes_per_second"`
	// ArtifactBytesPerSecond is each node's link to the artifact store.
	ArtifactBytesPerSecond float64 `json:"artifact_bytes_per_second"`
	// UnpackBytesPerSecond is how fast a fetched layer is unpacked.
	UnpackBytesPerSecond float64 `json:"unpack_bytes_per_second"`
	HighWatermark        int     `json:"high_watermark_percent"`
	LowWatermark         int     `json:"low_watermark_percent"`
}

// simBaseSpec is a stack of layers images share (e.g. CUDA + a framework).
type simBaseSpec struct {
	Name       string  `json:"name"`
	LayerBytes []int64 `json:"layer_bytes"`
}

// simImageGroup is Count images over one base, each with Layers own layers
// of LayerBytesMin..LayerBytesMax bytes. Weight is the group's share of
// Runs; within the group image i (from 1) is drawn ∝ 1/i^workload.zipf_s.
type simImageGroup struct {
	Prefix        string  `json:"prefix"`
	Count         int     `json:"count"`
	Base          string  `json:"base"`
	Layers        int     `json:"layers"`
	LayerBytesMin int64   `json:"layer_bytes_min"`
	LayerBytesMax int64   `json:"layer_bytes_max"`
	Weight        float64 `json:"weight"`
	// Artifacts names an artifact group a Run of this group mounts one of,
	// with ArtifactProbability.
	Artifacts           string  `json:"artifacts"`
	ArtifactProbability float64 `json:"artifact_probability"`
}

// simArtGroup is Count artifacts of Bytes each, drawn like images.
type simArtGroup struct {
	Prefix string `json:"prefix"`
	Count  int    `json:"count"`
	Bytes  int64  `json:"bytes"`
}

type simWorkload struct {
	Runs  int     `json:"runs"`
	ZipfS float64 `json:"zipf_s"`
	// Arrival: "poisson" (exponential gaps of mean_interval_seconds) or
	// "bursts" (bursts of burst_size Runs within burst_spread_seconds,
	// bursts mean_interval_seconds apart on average).
	Arrival             string  `json:"arrival"`
	MeanIntervalSeconds float64 `json:"mean_interval_seconds"`
	BurstSize           int     `json:"burst_size"`
	BurstSpreadSeconds  float64 `json:"burst_spread_seconds"`
	GPUs                []struct {
		Count  int     `json:"count"`
		Weight float64 `json:"weight"`
	} `json:"gpus"`
	// Durations are log-uniform between the two.
	DurationMinSeconds float64 `json:"duration_min_seconds"`
	DurationMaxSeconds float64 `json:"duration_max_seconds"`
	// MaxRuntimeFactor: each Run declares max_runtime_seconds of this
	// times its true duration (users overstate); 0 declares none.
	MaxRuntimeFactor float64 `json:"max_runtime_factor"`
}

// errTrace marks a trace the simulator refuses.
var errTrace = errors.New("invalid trace")

func traceErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errTrace, fmt.Sprintf(format, args...))
}

// Bounds that keep a hostile trace from exhausting memory or time.
const (
	maxSimNodes  = 4096
	maxSimGPUs   = 64
	maxSimRuns   = 200_000
	maxSimImages = 10_000
	maxSimLayers = 64
	maxSimDisk   = 1 << 50 // bytes
)

// decodeTrace reads one trace and refuses unknown fields and values the
// simulator cannot run.
func decodeTrace(r io.Reader) (*simTrace, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var t simTrace
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%w: %w", errTrace, err)
	}
	if dec.More() {
		return nil, traceErr("trailing data after the trace")
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

func (t *simTrace) validate() error {
	f, w := t.Fleet, t.Workload
	switch {
	case t.Name == "":
		return traceErr("name is empty")
	case f.Nodes < 1 || f.Nodes > maxSimNodes:
		return traceErr("fleet.nodes %d outside 1..%d", f.Nodes, maxSimNodes)
	case f.GPUsPerNode < 1 || f.GPUsPerNode > maxSimGPUs:
		return traceErr("fleet.gpus_per_node %d outside 1..%d", f.GPUsPerNode, maxSimGPUs)
	case f.DiskBytes < 1 || f.DiskBytes > maxSimDisk:
		return traceErr("fleet.disk_bytes %d outside 1..%d", f.DiskBytes, int64(maxSimDisk))
	case !positive(f.PullBytesPerSecond) || !positive(f.ArtifactBytesPerSecond) || !positive(f.UnpackBytesPerSecond):
		return traceErr("fleet bandwidths and unpack rate must be positive")
	case f.LowWatermark < 1 || f.HighWatermark > 99 || f.LowWatermark >= f.HighWatermark:
		return traceErr("watermarks %d/%d: want 1 ≤ low < high ≤ 99", f.LowWatermark, f.HighWatermark)
	case w.Runs < 1 || w.Runs > maxSimRuns:
		return traceErr("workload.runs %d outside 1..%d", w.Runs, maxSimRuns)
	case w.ZipfS < 0 || w.ZipfS > 10 || math.IsNaN(w.ZipfS):
		return traceErr("workload.zipf_s %v outside 0..10", w.ZipfS)
	case !positive(w.MeanIntervalSeconds):
		return traceErr("workload.mean_interval_seconds must be positive")
	case w.Arrival != "poisson" && w.Arrival != "bursts":
		return traceErr("workload.arrival %q: use poisson or bursts", w.Arrival)
	case w.Arrival == "bursts" && (w.BurstSize < 1 || w.BurstSize > maxSimRuns || w.BurstSpreadSeconds < 0 || math.IsNaN(w.BurstSpreadSeconds) || math.IsInf(w.BurstSpreadSeconds, 0)):
		return traceErr("bursts need burst_size ≥ 1 and burst_spread_seconds ≥ 0")
	case !positive(w.DurationMinSeconds) || !positive(w.DurationMaxSeconds) || w.DurationMinSeconds > w.DurationMaxSeconds:
		return traceErr("durations: want 0 < min ≤ max")
	case w.MaxRuntimeFactor != 0 && (w.MaxRuntimeFactor < 1 || w.MaxRuntimeFactor > 100 || math.IsNaN(w.MaxRuntimeFactor)):
		return traceErr("workload.max_runtime_factor %v: 0, or 1..100 (a Run may not outlive what it declares)", w.MaxRuntimeFactor)
	case len(w.GPUs) == 0:
		return traceErr("workload.gpus is empty")
	case len(t.Images) == 0:
		return traceErr("no image groups")
	}
	return t.validateGroups()
}

// validateGroups checks the workload's GPU counts and the catalogue's
// groups: bases, artifacts, images, each name known and unique.
func (t *simTrace) validateGroups() error {
	f, w := t.Fleet, t.Workload
	for _, g := range w.GPUs {
		if g.Count < 1 || g.Count > f.GPUsPerNode || !positive(g.Weight) {
			return traceErr("workload.gpus: count %d outside 1..%d or weight %v not positive", g.Count, f.GPUsPerNode, g.Weight)
		}
	}
	bases := map[string]bool{"": true}
	for _, b := range t.Bases {
		if b.Name == "" || bases[b.Name] || len(b.LayerBytes) > maxSimLayers {
			return traceErr("base %q: empty, repeated, or over %d layers", b.Name, maxSimLayers)
		}
		for _, s := range b.LayerBytes {
			if s < 1 || s > f.DiskBytes {
				return traceErr("base %q: layer of %d bytes outside 1..disk_bytes", b.Name, s)
			}
		}
		bases[b.Name] = true
	}
	arts := map[string]bool{}
	for _, a := range t.Artifacts {
		if a.Prefix == "" || arts[a.Prefix] || a.Count < 1 || a.Count > maxSimImages || a.Bytes < 1 || a.Bytes > f.DiskBytes {
			return traceErr("artifact group %q: empty or repeated prefix, count outside 1..%d, or bytes outside 1..disk_bytes", a.Prefix, maxSimImages)
		}
		arts[a.Prefix] = true
	}
	return t.validateImages(bases, arts)
}

// validateImages checks each image group against the bases and artifact
// groups named before it.
func (t *simTrace) validateImages(bases, arts map[string]bool) error {
	f := t.Fleet
	prefixes, images := map[string]bool{}, 0
	for _, g := range t.Images {
		images += g.Count
		switch {
		case g.Prefix == "" || prefixes[g.Prefix]:
			return traceErr("image group %q: empty or repeated prefix", g.Prefix)
		case g.Count < 1 || images > maxSimImages:
			return traceErr("image group %q: count %d, or over %d images in all", g.Prefix, g.Count, maxSimImages)
		case !bases[g.Base]:
			return traceErr("image group %q names unknown base %q", g.Prefix, g.Base)
		case g.Layers < 0 || g.Layers > maxSimLayers || (g.Layers == 0 && g.Base == ""):
			return traceErr("image group %q: layers %d outside 0..%d, or no layers at all", g.Prefix, g.Layers, maxSimLayers)
		case g.Layers > 0 && (g.LayerBytesMin < 1 || g.LayerBytesMin > g.LayerBytesMax || g.LayerBytesMax > f.DiskBytes):
			return traceErr("image group %q: want 1 ≤ layer_bytes_min ≤ layer_bytes_max ≤ disk_bytes", g.Prefix)
		case !positive(g.Weight):
			return traceErr("image group %q: weight must be positive", g.Prefix)
		case g.Artifacts != "" && !arts[g.Artifacts]:
			return traceErr("image group %q names unknown artifact group %q", g.Prefix, g.Artifacts)
		case g.ArtifactProbability < 0 || g.ArtifactProbability > 1 || math.IsNaN(g.ArtifactProbability):
			return traceErr("image group %q: artifact_probability outside 0..1", g.Prefix)
		}
		prefixes[g.Prefix] = true
	}
	return nil
}

// positive: a finite number above 0.
func positive(v float64) bool { return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }

// simImage is one image of the catalogue: its digest and its layers,
// bases first, by index into simCatalogue.layerBytes.
type simImage struct {
	name, digest string
	layers       []int
}

type simArtifact struct {
	name, digest string
	bytes        int64
}

// simCatalogue is a trace's images, layers and artifacts, expanded.
type simCatalogue struct {
	images     []simImage
	layerID    []string // layer digests
	layerBytes []int64
	artifacts  []simArtifact
}

// simRun is one Run of the workload.
type simRun struct {
	arrival  float64 // seconds from the trace's start
	image    int
	artifact int // -1: none
	gpus     int
	duration float64
	// maxRuntime is the declared max_runtime_seconds, 0 for none.
	maxRuntime int64
}

// fakeDigest is a stable sha256 digest for a catalogue entry's name.
func fakeDigest(kind, name string) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(kind+"\x00"+name)))
}

// expand builds the catalogue and the Runs; the same trace always gives the
// same result.
func (t *simTrace) expand() (simCatalogue, []simRun) {
	rng := rand.New(rand.NewPCG(t.Seed, t.Seed^0x9e3779b97f4a7c15))
	// One generator, catalogue first: the draws' order is the trace's.
	cat, groupStart, artStart := t.catalogue(rng)
	return cat, t.runs(rng, groupStart, artStart)
}

// catalogue builds the layers, artifacts and images, and where each image
// and artifact group starts in them.
func (t *simTrace) catalogue(rng *rand.Rand) (cat simCatalogue, groupStart []int, artStart map[string]int) {
	addLayer := func(name string, size int64) int {
		cat.layerID = append(cat.layerID, fakeDigest("layer", name))
		cat.layerBytes = append(cat.layerBytes, size)
		return len(cat.layerID) - 1
	}
	baseLayers := map[string][]int{}
	for _, b := range t.Bases {
		for i, s := range b.LayerBytes {
			baseLayers[b.Name] = append(baseLayers[b.Name], addLayer(fmt.Sprintf("base/%s/%d", b.Name, i), s))
		}
	}
	artStart = map[string]int{}
	for _, a := range t.Artifacts {
		artStart[a.Prefix] = len(cat.artifacts)
		for i := range a.Count {
			name := fmt.Sprintf("%s-%d", a.Prefix, i+1)
			cat.artifacts = append(cat.artifacts, simArtifact{name: name, digest: fakeDigest("artifact", t.Name+"/"+name), bytes: a.Bytes})
		}
	}
	groupStart = make([]int, len(t.Images))
	for gi, g := range t.Images {
		groupStart[gi] = len(cat.images)
		for i := range g.Count {
			name := fmt.Sprintf("%s-%d", g.Prefix, i+1)
			im := simImage{name: name, layers: slices.Clone(baseLayers[g.Base])}
			for j := range g.Layers {
				size := g.LayerBytesMin + rng.Int64N(g.LayerBytesMax-g.LayerBytesMin+1)
				im.layers = append(im.layers, addLayer(fmt.Sprintf("%s/%s/%d", t.Name, name, j), size))
			}
			im.digest = fakeDigest("image", t.Name+"/"+name)
			cat.images = append(cat.images, im)
		}
	}
	return cat, groupStart, artStart
}

// runs draws the workload's Runs, sorted by arrival.
func (t *simTrace) runs(rng *rand.Rand, groupStart []int, artStart map[string]int) []simRun {
	w := t.Workload
	groupW := make([]float64, len(t.Images))
	for i, g := range t.Images {
		groupW[i] = g.Weight
	}
	gpuW := make([]float64, len(w.GPUs))
	for i, g := range w.GPUs {
		gpuW[i] = g.Weight
	}
	zipf := map[int][]float64{}
	rank := func(n int) int {
		if zipf[n] == nil {
			ws := make([]float64, n)
			for i := range ws {
				ws[i] = 1 / math.Pow(float64(i+1), w.ZipfS)
			}
			zipf[n] = ws
		}
		return pick(rng, zipf[n])
	}
	runs := make([]simRun, 0, w.Runs)
	at, inBurst := 0.0, 0
	lo, hi := math.Log(w.DurationMinSeconds), math.Log(w.DurationMaxSeconds)
	for range w.Runs {
		switch {
		case w.Arrival == "poisson":
			at += rng.ExpFloat64() * w.MeanIntervalSeconds
		case inBurst == 0:
			at += rng.ExpFloat64() * w.MeanIntervalSeconds
			inBurst = w.BurstSize
			fallthrough
		default:
			inBurst--
		}
		arrival := at
		if w.Arrival == "bursts" {
			arrival += rng.Float64() * w.BurstSpreadSeconds
		}
		gi := pick(rng, groupW)
		g := t.Images[gi]
		r := simRun{arrival: arrival, image: groupStart[gi] + rank(g.Count), artifact: -1,
			gpus: w.GPUs[pick(rng, gpuW)].Count, duration: math.Exp(lo + rng.Float64()*(hi-lo))}
		if g.Artifacts != "" && rng.Float64() < g.ArtifactProbability {
			var n int
			for _, a := range t.Artifacts {
				if a.Prefix == g.Artifacts {
					n = a.Count
				}
			}
			r.artifact = artStart[g.Artifacts] + rank(n)
		}
		if w.MaxRuntimeFactor > 0 {
			r.maxRuntime = int64(math.Ceil(r.duration * w.MaxRuntimeFactor))
		}
		runs = append(runs, r)
	}
	slices.SortStableFunc(runs, func(a, b simRun) int { return cmpFloat(a.arrival, b.arrival) })
	return runs
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// pick draws an index with probability ∝ its weight.
func pick(rng *rand.Rand, weights []float64) int {
	var sum float64
	for _, w := range weights {
		sum += w
	}
	x := rng.Float64() * sum
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(weights) - 1
}

// loadTraces reads the named trace files, or the committed corpus when
// none are named.
func loadTraces(files []string, read func(string) ([]byte, error)) ([]*simTrace, error) {
	if len(files) == 0 {
		entries, err := traceCorpus.ReadDir("testdata/traces")
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			files = append(files, "corpus:"+e.Name())
		}
	}
	var out []*simTrace
	for _, f := range files {
		var b []byte
		var err error
		if name, ok := strings.CutPrefix(f, "corpus:"); ok {
			b, err = traceCorpus.ReadFile(path.Join("testdata/traces", name))
		} else {
			b, err = read(f)
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", f, err)
		}
		t, err := decodeTrace(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", f, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// floorBytes are the bytes of the distinct layers and artifacts the
// trace's Runs use: what a fleet pulls if each reaches one node once.
func (t *simTrace) floorBytes() int64 {
	cat, runs := t.expand()
	layers, arts := map[int]bool{}, map[int]bool{}
	var sum int64
	for _, r := range runs {
		for _, l := range cat.images[r.image].layers {
			if !layers[l] {
				layers[l] = true
				sum += cat.layerBytes[l]
			}
		}
		if r.artifact >= 0 && !arts[r.artifact] {
			arts[r.artifact] = true
			sum += cat.artifacts[r.artifact].bytes
		}
	}
	return sum
}
