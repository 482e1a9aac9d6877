package placement

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// scenario is one file of testdata/scenarios: a fleet, a Run, and the
// decision placement must reach with the reasons it must give.
type scenario struct {
	Name   string                   `json:"name"`
	Images map[string]scenarioImage `json:"images"`
	Nodes  []scenarioNode           `json:"nodes"`
	// Run is a RunRequest; its image may name an entry of Images by key
	// ("@app") instead of a full reference.
	Run schemas.RunRequest `json:"run"`
	// Artifacts is the catalog the Run's artifacts resolve in, by name.
	Artifacts map[string]scenarioArtifact `json:"artifacts"`
	// Penalties are the nodes an earlier attempt failed on, with why
	// (Request.Penalties).
	Penalties map[string]string `json:"penalties"`
	Expect    struct {
		Winner string `json:"winner"`
		Queued bool   `json:"queued"`
		// FetchFirst: the winner lacks the Run's bytes and takes no cards
		// until they are there (BookingDecision.FetchFirst).
		FetchFirst bool                    `json:"fetch_first"`
		Reasons    map[string]schemas.Code `json:"reasons"`
		// GPUs are the winner's cards the decision books, by UUID
		// ("<node>-gpu<index>"); checked when the scenario names them.
		GPUs []string `json:"gpus"`
		// ArtifactFetchBytes are the bytes each named candidate would
		// fetch, as its decision entry must say.
		ArtifactFetchBytes map[string]int64 `json:"artifact_fetch_bytes"`
		// PenaltySeconds and IdleGPUSeconds are what each named
		// candidate's components must say (to 0.01 s), DetailContains a
		// text its detail must hold.
		PenaltySeconds map[string]float64 `json:"penalty_seconds"`
		IdleGPUSeconds map[string]float64 `json:"idle_gpu_seconds"`
		DetailContains map[string]string  `json:"detail_contains"`
	} `json:"expect"`
}

type scenarioArtifact struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

type scenarioImage struct {
	Digest   string           `json:"digest"`
	Platform schemas.Platform `json:"platform"`
	// Index: the digest names a multi-platform index, and Platform is the
	// build the nodes that hold it fetched.
	Index  bool `json:"index"`
	Layers []struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	} `json:"layers"`
}

type scenarioNode struct {
	ID           string                      `json:"id"`
	State        schemas.NodeState           `json:"state"`
	Price        float64                     `json:"price_per_hour"`
	Capacity     schemas.Resources           `json:"capacity"`
	MaxWorkloads int                         `json:"max_workloads"`
	Arch         string                      `json:"arch"`
	Variant      string                      `json:"variant"`
	Images       []string                    `json:"images"`         // hot
	LayersOf     []string                    `json:"partial_images"` // first layer only
	Caches       []schemas.CacheFact         `json:"caches"`
	GPUs         []schemas.AcceleratorDevice `json:"gpus"`
	// NoCDI: the node's cards have no CDI device (no usable CDI spec).
	NoCDI        bool     `json:"no_cdi"`
	Driver       string   `json:"driver_capability"`
	DiskFree     int64    `json:"disk_free"`
	LeaseIn      int      `json:"lease_expires_in_seconds"`
	FactsAge     int      `json:"facts_age_seconds"`
	NetworkModes []string `json:"network_modes"` // none listed: an agent that does not say
	// Support is what the node declares; absent: an agent that declares
	// nothing (schemas.NodeFacts.Supports).
	Support *schemas.NodeSupport `json:"support"`
	// Artifacts are the catalog artifacts the node holds, by name;
	// ArtifactsUnlisted: the node did not enumerate its replicas.
	Artifacts         []string          `json:"artifacts"`
	ArtifactsUnlisted bool              `json:"artifacts_unlisted"`
	Running           []scenarioBooking `json:"running"`
	Queued            []scenarioBooking `json:"queued"`
	// Interruptible: the node is rented spot capacity; Interrupting: it
	// reported its provider's notice that it is being taken back.
	Interruptible bool `json:"interruptible"`
	Interrupting  bool `json:"interrupting"`
}

type scenarioBooking struct {
	Resources schemas.Resources `json:"resources"`
	EndsIn    int               `json:"ends_in_seconds"`
	// Fetching: a booking whose bytes are still on their way, due in
	// ReadyIn seconds.
	Fetching bool `json:"fetching"`
	ReadyIn  int  `json:"ready_in_seconds"`
}

// booking is b on node id as the i-th of its kind.
func (b scenarioBooking) booking(id string, i int) Booking {
	return Booking{RunID: id + "-" + strconv.Itoa(i), Resources: b.Resources, ExpectedEnd: scenarioNow.Add(time.Duration(b.EndsIn) * time.Second),
		Fetching: b.Fetching, ReadyAt: scenarioNow.Add(time.Duration(b.ReadyIn) * time.Second)}
}

var scenarioNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (s scenario) fleet(t *testing.T) (*Fleet, Request) {
	var nodes []*Node
	for _, sn := range s.Nodes {
		if sn.State == "" {
			sn.State = schemas.NodeReady
		}
		if sn.LeaseIn == 0 {
			sn.LeaseIn = 30
		}
		if sn.Arch == "" {
			sn.Arch = "amd64"
		}
		facts := &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: sn.Arch, Variant: sn.Variant,
			Accelerator: schemas.AcceleratorFacts{Established: true},
			Disk:        schemas.DiskFacts{Known: true, TotalBytes: 1 << 40, FreeBytes: 1 << 39}}, Caches: sn.Caches}
		if sn.DiskFree != 0 {
			facts.Host.Disk.FreeBytes = sn.DiskFree
		}
		facts.Host.NetworkModes = sn.NetworkModes
		facts.Support = sn.Support
		if len(sn.GPUs) > 0 {
			facts.Host.Accelerator = schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", DriverVersion: "550.54", DriverCapability: sn.Driver, Devices: sn.GPUs,
				Cards: cardsOf(sn.ID, sn.GPUs, !sn.NoCDI)}
		}
		for _, key := range sn.Images {
			facts.Images = append(facts.Images, locality(t, s.Images, key, schemas.LocalityHot, 0))
		}
		if len(sn.Artifacts) > 0 || sn.ArtifactsUnlisted {
			facts.Artifacts = &schemas.ArtifactInventory{Enumerated: !sn.ArtifactsUnlisted}
			for _, name := range sn.Artifacts {
				a, ok := s.Artifacts[name]
				if !ok {
					t.Fatalf("node names unknown artifact %q", name)
				}
				facts.Artifacts.Replicas = append(facts.Artifacts.Replicas, schemas.ArtifactReplica{Digest: a.Digest, SizeBytes: a.Size, VerifiedAt: scenarioNow})
			}
		}
		for _, key := range sn.LayersOf {
			facts.Images = append(facts.Images, locality(t, s.Images, key, schemas.LocalityPartial, 1))
		}
		rec := schemas.NodeRecord{NodeID: sn.ID, State: sn.State, Capacity: sn.Capacity, MaxWorkloads: sn.MaxWorkloads, PricePerHour: sn.Price,
			LeaseExpires: scenarioNow.Add(time.Duration(sn.LeaseIn) * time.Second), Facts: facts,
			FactsReceivedAt: scenarioNow.Add(-time.Duration(sn.FactsAge) * time.Second), FencingToken: 1, Generation: 1, Interruptible: sn.Interruptible}
		if sn.Interrupting {
			rec.Interruption = &schemas.InterruptionNotice{Source: "url", At: scenarioNow.Add(2 * time.Minute)}
		}
		n := NewNode(rec)
		for i, b := range sn.Running {
			// A running booking holds the first free cards it asks for.
			rb := b.booking(sn.ID+"-r", i)
			rb.GPUs, _, _ = n.PickGPUs(b.Resources.GPUCount, nil)
			n.Running = append(n.Running, rb)
		}
		for i, b := range sn.Queued {
			qb := b.booking(sn.ID+"-q", i)
			qb.ExpectedEnd = time.Time{}
			n.Queued = append(n.Queued, qb)
		}
		nodes = append(nodes, n)
	}
	run := s.Run
	if key, ok := strings.CutPrefix(run.Image, "@"); ok {
		run.Image = "registry.example/" + key + "@" + s.Images[key].Digest
	}
	if err := run.Validate(); err != nil {
		t.Fatalf("scenario run is invalid: %v", err)
	}
	ref, _ := schemas.ParseImageRef("image", run.Image)
	req := Request{RunID: "r-scenario", Attempt: 1, Run: run, Digest: ref.Digest, Penalties: s.Penalties, Spot: run.Spot}
	for _, u := range run.Artifacts {
		a, ok := s.Artifacts[u.Name]
		if !ok {
			t.Fatalf("run names unknown artifact %q", u.Name)
		}
		req.Artifacts = append(req.Artifacts, schemas.ArtifactMount{Name: u.Name, Version: "v1", Digest: a.Digest, SizeBytes: a.Size,
			Source: schemas.ArtifactSource{Object: "sha256/" + strings.TrimPrefix(a.Digest, "sha256:")}, Path: u.Path})
	}
	return NewFleet(nodes), req
}

// cardsOf lists the cards of grouped devices by identity, UUIDs
// "<node>-gpu<index>", each with a CDI device when cdi holds.
func cardsOf(node string, groups []schemas.AcceleratorDevice, cdi bool) []schemas.GPUCard {
	var cards []schemas.GPUCard
	for _, g := range groups {
		for range g.Count {
			i := len(cards)
			c := schemas.GPUCard{Index: i, UUID: node + "-gpu" + strconv.Itoa(i), Model: g.Model, MemoryBytes: g.MemoryBytes, Health: schemas.GPUHealthOK}
			if cdi {
				c.CDIDevices = []string{"nvidia.com/gpu=" + strconv.Itoa(i)}
			}
			cards = append(cards, c)
		}
	}
	return cards
}

// locality renders an image as a node reports it; a partial image holds
// only its first `keep` layers (0 = all).
func locality(t *testing.T, images map[string]scenarioImage, key string, state schemas.LocalityState, keep int) schemas.ImageLocality {
	im, ok := images[key]
	if !ok {
		t.Fatalf("node names unknown image %q", key)
	}
	l := schemas.ImageLocality{ManifestDigest: im.Digest, Platform: im.Platform, Index: im.Index, State: state, ContentPresent: state == schemas.LocalityHot}
	for i, layer := range im.Layers {
		if keep > 0 && i >= keep {
			break
		}
		l.LayerDigests = append(l.LayerDigests, layer.Digest)
		l.LayerSizes = append(l.LayerSizes, layer.Size)
	}
	if state == schemas.LocalityPartial {
		// A partial image's layers are present even though the image is
		// not: mark content present for the held layers' sake.
		l.ContentPresent = true
		l.ManifestDigest = "sha256:" + strings.Repeat("f", 64)
	}
	return l
}

// TestAcceptance_PlacementScenarios runs the whole scenario corpus.
func TestAcceptance_PlacementScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/scenarios/*.json")
	if err != nil || len(files) < 7 {
		t.Fatalf("scenario corpus: %d files, %v", len(files), err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".json"), func(t *testing.T) {
			s := loadScenario(t, file)
			fleet, req := s.fleet(t)
			d := Decide(req, fleet, scenarioNow, DefaultConfig())
			if d.Winner != s.Expect.Winner || d.WinnerQueued != s.Expect.Queued || d.FetchFirst != s.Expect.FetchFirst {
				t.Errorf("%s: winner %q queued %v fetch first %v, want %q queued %v fetch first %v", s.Name, d.Winner, d.WinnerQueued, d.FetchFirst,
					s.Expect.Winner, s.Expect.Queued, s.Expect.FetchFirst)
			}
			if s.Expect.GPUs != nil && !slices.Equal(d.GPUs, s.Expect.GPUs) {
				t.Errorf("%s: booked GPUs %v, want %v", s.Name, d.GPUs, s.Expect.GPUs)
			}
			if len(d.Candidates) != len(s.Nodes) {
				t.Errorf("decision lists %d candidates for %d nodes", len(d.Candidates), len(s.Nodes))
			}
			for _, c := range d.Candidates {
				if c.NodeID != d.Winner && c.Reason == "" {
					t.Errorf("%s lost without a reason", c.NodeID)
				}
				if want, ok := s.Expect.Reasons[c.NodeID]; ok && c.Reason != want {
					t.Errorf("%s: reason %q (%s), want %q", c.NodeID, c.Reason, c.Detail, want)
				}
				if want, ok := s.Expect.ArtifactFetchBytes[c.NodeID]; ok && c.Components.ArtifactFetchBytes != want {
					t.Errorf("%s: would fetch %d artifact bytes, want %d", c.NodeID, c.Components.ArtifactFetchBytes, want)
				}
				checkComponents(t, s, c)
			}
			if t.Failed() {
				out, _ := json.MarshalIndent(d, "", "  ")
				t.Logf("decision:\n%s", out)
			}
		})
	}
}

// checkComponents checks c against the scenario's expected penalty, idle
// cards and detail.
func checkComponents(t *testing.T, s scenario, c schemas.Candidate) {
	t.Helper()
	if want, ok := s.Expect.PenaltySeconds[c.NodeID]; ok && math.Abs(c.Components.PenaltySeconds-want) > 0.01 {
		t.Errorf("%s: penalty %.2fs, want %.2fs", c.NodeID, c.Components.PenaltySeconds, want)
	}
	if want, ok := s.Expect.IdleGPUSeconds[c.NodeID]; ok && math.Abs(c.Components.IdleGPUSeconds-want) > 0.01 {
		t.Errorf("%s: idle GPU seconds %.3f, want %.3f", c.NodeID, c.Components.IdleGPUSeconds, want)
	}
	if want, ok := s.Expect.DetailContains[c.NodeID]; ok && !strings.Contains(c.Detail, want) {
		t.Errorf("%s: detail %q lacks %q", c.NodeID, c.Detail, want)
	}
}

func loadScenario(t *testing.T, file string) scenario {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var s scenario
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return s
}
