package prefetch

import (
	"errors"
	"strings"
	"testing"

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
