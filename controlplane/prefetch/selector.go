package prefetch

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// Selector keys. A bare term (no "=") is a node id.
const (
	KeyNode   = "node"   // the node's id
	KeyArch   = "arch"   // facts' host architecture, e.g. amd64
	KeyOS     = "os"     // facts' host OS, e.g. linux
	KeyGPU    = "gpu"    // a card model contains the value, case-insensitively (gpu=H200)
	KeyRental = "rental" // the node's rental id
)

var selectorKeys = []string{KeyArch, KeyGPU, KeyNode, KeyOS, KeyRental}

// platformWord is an os or arch value as facts spell them.
var platformWord = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)

// Selector picks nodes: comma-separated terms, each a node id or
// key=value. Terms with the same key are alternatives; different keys must
// all hold. "n1,n2" is either node; "gpu=H200,arch=amd64" is an amd64 node
// with an H200. The zero Selector matches every node.
type Selector struct {
	terms map[string][]string // key → values, sorted, no duplicates
}

// ParseSelector parses an operator's selector. The error is a
// *schemas.Refusal naming field "nodes".
func ParseSelector(s string) (Selector, error) {
	sel := Selector{terms: map[string][]string{}}
	if strings.TrimSpace(s) == "" {
		return Selector{}, nil
	}
	if len(s) > schemas.MaxSelectorBytes {
		return Selector{}, refuse(schemas.CodeValueTooLong, "a node selector is at most %d bytes; name fewer nodes or use --count", schemas.MaxSelectorBytes)
	}
	for i, raw := range strings.Split(s, ",") {
		term := strings.TrimSpace(raw)
		if term == "" {
			return Selector{}, refuse(schemas.CodeInvalidSelector, "term %d is empty; separate terms with single commas: node-a,node-b or gpu=H200", i+1)
		}
		key, value, hasKey := strings.Cut(term, "=")
		if !hasKey {
			key, value = KeyNode, term
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if err := checkTerm(i+1, key, value); err != nil {
			return Selector{}, err
		}
		if !slices.Contains(sel.terms[key], value) {
			sel.terms[key] = append(sel.terms[key], value)
		}
	}
	for _, vs := range sel.terms {
		slices.Sort(vs)
	}
	return sel, nil
}

func checkTerm(n int, key, value string) error {
	if !slices.Contains(selectorKeys, key) {
		return refuse(schemas.CodeInvalidSelector, "term %d: unknown key (use %s=VALUE, or a bare node id)", n, strings.Join(selectorKeys, "=VALUE, "))
	}
	if value == "" {
		return refuse(schemas.CodeInvalidSelector, "term %d (%s=) has no value", n, key)
	}
	switch key {
	case KeyNode, KeyRental:
		if schemas.ValidateID(key, value, schemas.CodeInvalidSelector) != nil {
			return refuse(schemas.CodeInvalidSelector, "term %d: a %s id is 1-128 characters of [A-Za-z0-9._:-]; `warmfleet node list` shows them", n, key)
		}
	case KeyArch, KeyOS:
		if !platformWord.MatchString(value) {
			return refuse(schemas.CodeInvalidSelector, "term %d: %s is a lowercase word such as amd64 or linux", n, key)
		}
	case KeyGPU:
		if len(value) > 128 || strings.ContainsAny(value, "=\x00\r\n\t") {
			return refuse(schemas.CodeInvalidSelector, "term %d: gpu is part of a card model of at most 128 characters, e.g. gpu=H200", n)
		}
	}
	return nil
}

func refuse(code schemas.Code, format string, args ...any) *schemas.Refusal {
	return &schemas.Refusal{Code: code, Field: "nodes", Reason: fmt.Sprintf(format, args...)}
}

// Empty says the selector matches every node.
func (s Selector) Empty() bool { return len(s.terms) == 0 }

// NodeIDs are the node ids the selector names, sorted.
func (s Selector) NodeIDs() []string { return slices.Clone(s.terms[KeyNode]) }

// String is the selector's canonical form: keys in order, values sorted.
func (s Selector) String() string {
	var parts []string
	for _, k := range selectorKeys {
		for _, v := range s.terms[k] {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, ",")
}

// Matches says node n satisfies every key of the selector.
func (s Selector) Matches(n schemas.NodeRecord) bool {
	for key, values := range s.terms {
		if !slices.ContainsFunc(values, func(v string) bool { return matchesTerm(n, key, v) }) {
			return false
		}
	}
	return true
}

func matchesTerm(n schemas.NodeRecord, key, value string) bool {
	switch key {
	case KeyNode:
		return n.NodeID == value
	case KeyRental:
		return n.RentalID == value
	}
	if n.Facts == nil {
		return false // no facts, nothing to match against
	}
	h := n.Facts.Host
	switch key {
	case KeyArch:
		return h.Architecture == value
	case KeyOS:
		return h.OS == value
	case KeyGPU:
		want := strings.ToLower(value)
		for _, d := range h.Accelerator.Devices {
			if strings.Contains(strings.ToLower(d.Model), want) {
				return true
			}
		}
		for _, c := range h.Accelerator.Cards {
			if strings.Contains(strings.ToLower(c.Model), want) {
				return true
			}
		}
	}
	return false
}
