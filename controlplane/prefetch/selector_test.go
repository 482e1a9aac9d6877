package prefetch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

func TestParseSelector(t *testing.T) {
	for _, c := range []struct {
		in, canonical string
	}{
		{"", ""},
		{"  ", ""},
		{"node-a", "node=node-a"},
		{"node-b, node-a ,node-a", "node=node-a,node=node-b"},
		{"gpu=H200,arch=amd64", "arch=amd64,gpu=H200"},
		{"gpu = NVIDIA H200 , os=linux, rental=r-1", "gpu=NVIDIA H200,os=linux,rental=r-1"},
		{"node=n1.zone:2", "node=n1.zone:2"},
	} {
		sel, err := ParseSelector(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if got := sel.String(); got != c.canonical {
			t.Errorf("%q: canonical %q, want %q", c.in, got, c.canonical)
		}
	}
	for _, c := range []struct {
		in   string
		code schemas.Code
		says string
	}{
		{"a,,b", schemas.CodeInvalidSelector, "term 2 is empty"},
		{"a,", schemas.CodeInvalidSelector, "term 2 is empty"},
		{"colour=red", schemas.CodeInvalidSelector, "unknown key"},
		{"arch=", schemas.CodeInvalidSelector, "no value"},
		{"arch=AMD64", schemas.CodeInvalidSelector, "lowercase word"},
		{"node=-bad", schemas.CodeInvalidSelector, "node id"},
		{"bad/node", schemas.CodeInvalidSelector, "node id"},
		{"gpu=a=b", schemas.CodeInvalidSelector, "card model"},
		{strings.Repeat("n,", schemas.MaxSelectorBytes), schemas.CodeValueTooLong, "at most"},
	} {
		_, err := ParseSelector(c.in)
		var r *schemas.Refusal
		if !errors.As(err, &r) || r.Code != c.code || r.Field != "nodes" || !strings.Contains(r.Reason, c.says) {
			t.Errorf("%.40q: %v, want %s on nodes saying %q", c.in, err, c.code, c.says)
		}
	}
}

// node is a live, ready node record with facts.
func node(id, arch, gpu string, free int64, images ...schemas.ImageLocality) schemas.NodeRecord {
	n := schemas.NodeRecord{NodeID: id, State: schemas.NodeReady, FencingToken: 1, LeaseExpires: t0.Add(time.Minute),
		Facts: &schemas.NodeFacts{Host: schemas.HostFacts{OS: "linux", Architecture: arch, Disk: schemas.DiskFacts{Known: free >= 0, FreeBytes: max(free, 0)}}, Images: images}}
	if gpu != "" {
		n.Facts.Host.Accelerator = schemas.AcceleratorFacts{Established: true, Vendor: "nvidia", Devices: []schemas.AcceleratorDevice{{Model: gpu, Count: 1}}}
	}
	return n
}

var t0 = time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)

const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func image(state schemas.LocalityState) schemas.ImageLocality {
	return schemas.ImageLocality{ManifestDigest: digest, State: state}
}

func TestSelectorMatches(t *testing.T) {
	h200 := node("a", "amd64", "NVIDIA H200", 0)
	h200.RentalID = "r-1"
	arm := node("b", "arm64", "", 0)
	bare := schemas.NodeRecord{NodeID: "c"}
	for _, c := range []struct {
		sel  string
		want []bool // a, b, c
	}{
		{"", []bool{true, true, true}},
		{"a,c", []bool{true, false, true}},
		{"gpu=h200", []bool{true, false, false}},
		{"arch=amd64,arch=arm64", []bool{true, true, false}},
		{"arch=arm64,gpu=H200", []bool{false, false, false}},
		{"rental=r-1,a", []bool{true, false, false}},
		{"os=linux", []bool{true, true, false}},
	} {
		sel, err := ParseSelector(c.sel)
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range []schemas.NodeRecord{h200, arm, bare} {
			if got := sel.Matches(n); got != c.want[i] {
				t.Errorf("%q on %s: %v, want %v", c.sel, n.NodeID, got, c.want[i])
			}
		}
	}
}

func TestChoose(t *testing.T) {
	lost := node("lost", "amd64", "", 10)
	lost.LeaseExpires = t0.Add(-time.Second)
	draining := node("drain", "amd64", "", 10)
	draining.State = schemas.NodeDraining
	fleet := []schemas.NodeRecord{
		node("hot", "amd64", "", 900, image(schemas.LocalityHot)),
		node("partial", "amd64", "", 5, image(schemas.LocalityPartial)),
		node("roomy", "amd64", "", 800),
		node("tight", "amd64", "", 100),
		node("unknown-disk", "amd64", "", -1),
		node("arm", "arm64", "", 999),
		lost, draining,
	}
	choose := func(sel string, count int) Plan {
		t.Helper()
		s, err := ParseSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Choose(fleet, t0, s, count, digest)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eq := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	// Everything live, hot nodes too (the node answers ready at once).
	p := choose("", 0)
	eq("all", p.Targets, "arm", "hot", "partial", "roomy", "tight", "unknown-disk")
	if len(p.Skipped) != 0 {
		t.Errorf("all: unnamed unfit nodes listed as skipped: %+v", p.Skipped)
	}
	// The best that lack it: partial first, then the most free disk; unknown disk last.
	eq("count 3", choose("arch=amd64", 3).Targets, "partial", "roomy", "tight")
	eq("count 4", choose("arch=amd64", 4).Targets, "partial", "roomy", "tight", "unknown-disk")
	eq("count beyond", choose("arch=amd64", 50).Targets, "partial", "roomy", "tight", "unknown-disk")
	eq("count of hot only", choose("hot", 1).Targets)
	// Named nodes that cannot take it are skipped with why.
	p = choose("lost,drain,roomy", 0)
	eq("named", p.Targets, "roomy")
	if len(p.Skipped) != 2 || p.Skipped[0].NodeID != "drain" || !strings.Contains(p.Skipped[0].Reason, "draining") ||
		p.Skipped[1].NodeID != "lost" || !strings.Contains(p.Skipped[1].Reason, "not live") || p.Skipped[1].State != schemas.PrefetchSkipped {
		t.Errorf("skipped %+v", p.Skipped)
	}
	// A named node not in the registry refuses the request.
	s, _ := ParseSelector("roomy,ghost")
	if _, err := Choose(fleet, t0, s, 0, digest); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "nodes"}) {
		t.Errorf("unknown node: %v", err)
	}
}

func TestOpID(t *testing.T) {
	id := schemas.PrefetchIDFor("req")
	if got := OpID(id, "node-a"); got != id+".node-a.prefetch" || schemas.ValidateID("op", got, schemas.CodeMalformed) != nil {
		t.Errorf("OpID %q", got)
	}
	long := strings.Repeat("n", 128)
	a, b := OpID(id, long), OpID(id, long[:127]+"m")
	if a == b || schemas.ValidateID("op", a, schemas.CodeMalformed) != nil || len(a) > 128 {
		t.Errorf("long node ids: %q %q", a, b)
	}
}

// FuzzParseSelector: any input is parsed or refused with a coded refusal on
// field nodes, never a panic; what parses has a canonical form that parses
// to itself and matches the same nodes.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"", "node-a", "a,b", "gpu=H200,arch=amd64", "arch=", ",", "x=y", "node=a=b", "gpu= NVIDIA H200 "} {
		f.Add(s)
	}
	nodes := []schemas.NodeRecord{node("a", "amd64", "NVIDIA H200", 1), node("b", "arm64", "", 1), {NodeID: "c", RentalID: "r"}}
	f.Fuzz(func(t *testing.T, in string) {
		sel, err := ParseSelector(in)
		if err != nil {
			var r *schemas.Refusal
			if !errors.As(err, &r) || r.Field != "nodes" || (r.Code != schemas.CodeInvalidSelector && r.Code != schemas.CodeValueTooLong) {
				t.Fatalf("%q: uncoded refusal %v", in, err)
			}
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil || again.String() != sel.String() {
			t.Fatalf("%q: canonical %q does not parse to itself: %v %q", in, sel.String(), err, again.String())
		}
		for _, n := range nodes {
			if sel.Matches(n) != again.Matches(n) {
				t.Fatalf("%q: canonical form matches %s differently", in, n.NodeID)
			}
		}
	})
}
