// Package identities reads the identity table of docs/security.md ("##
// Identities and their permissions"): one row per NATS identity, with the
// subjects it may publish and subscribe to, whether it may answer requests,
// and the streams and buckets it reaches. Code (this package's tests) and the
// end-to-end confinement test check bus's Perms* functions and the live
// server against it, so the page cannot drift from what is enforced.
package identities

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Heading is the section of docs/security.md that holds the table.
const Heading = "## Identities and their permissions"

var placeholderForm = regexp.MustCompile(`<[a-z]+>`)

// Placeholders a pattern in the table may hold for the values of one
// login: its node, its Run (log logins), its producer name, its tenant
// (a producer's, or a log login's Run's), the consumer its artifact grant
// names, its invitation's inbox token (bus.EnrollingInboxPrefix's last). A
// pattern naming another is an error.
const (
	PlaceholderNode     = "<id>"
	PlaceholderRun      = "<run>"
	PlaceholderProducer = "<name>"
	PlaceholderTenant   = "<tenant>"
	PlaceholderConsumer = "<consumer>"
	PlaceholderInvite   = "<invite>"
)

// Replies says whether an identity may answer the requests it receives.
type Replies string

const (
	RepliesNone Replies = "no"  // no reply beyond its publish patterns
	RepliesOne  Replies = "one" // one reply per request it receives, within a minute (allow_responses)
	RepliesAny  Replies = "any" // full permissions: any subject
)

// AllStreams in Row.Reaches stands for every stream and bucket.
const AllStreams = "*"

// Row is one identity's line of the table, references to other rows
// resolved.
type Row struct {
	Line      int
	Identity  string
	Publish   []string // subject patterns, with placeholders
	Subscribe []string
	Replies   Replies
	// Reaches names the streams (by stream name) and the KV and object
	// buckets (by bucket name) its publish patterns reach, or AllStreams.
	Reaches []string
}

var (
	ticked = regexp.MustCompile("`([^`]+)`")
	// rowRef is a cell that repeats another row's: "as the **operator** row".
	rowRef = regexp.MustCompile(`^as the \*\*([^*]+)\*\* row$`)
)

// Columns of the table, in order.
var Columns = []string{"identity", "logs in as (user / secret)", "may publish", "may subscribe", "may answer", "streams and buckets it reaches"}

// ParseTable reads the identity table from the security page. A publish or
// subscribe cell is its backticked patterns (other words are notes); a
// cell "as the **<identity>** row" repeats that row's cell. The answer cell
// starts with "no", "one" or "any". The streams cell is its backticked
// names, "every stream and bucket", or "none".
func ParseTable(page string) ([]Row, error) {
	raw, err := rawRows(page)
	if err != nil {
		return nil, err
	}
	byName := map[string][]string{}
	for _, r := range raw {
		byName[r.cells[0]] = r.cells
	}
	var rows []Row
	for _, r := range raw {
		row, err := parseRow(r.line, r.cells, byName)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

type rawRow struct {
	line  int
	cells []string
}

func rawRows(page string) ([]rawRow, error) {
	var rows []rawRow
	in, header := false, 0
	for i, line := range strings.Split(page, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.TrimSpace(line) == Heading
			continue
		case !in || !strings.HasPrefix(line, "|"):
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if len(cells) != len(Columns) {
			return nil, fmt.Errorf("security page line %d: %d columns, want %d (%s)", i+1, len(cells), len(Columns), strings.Join(Columns, " | "))
		}
		if header < 2 { // the column names and the separator
			if header == 0 && !slices.Equal(cells, Columns) {
				return nil, fmt.Errorf("security page line %d: columns %q, want %q", i+1, cells, Columns)
			}
			header++
			continue
		}
		rows = append(rows, rawRow{line: i + 1, cells: cells})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("security page: no identity table under %q", Heading)
	}
	return rows, nil
}

func parseRow(line int, cells []string, byName map[string][]string) (Row, error) {
	r := Row{Line: line, Identity: cells[0]}
	cell := func(col int) (string, error) {
		c := cells[col]
		if m := rowRef.FindStringSubmatch(c); m != nil {
			other, ok := byName[m[1]]
			if !ok || rowRef.MatchString(other[col]) {
				return "", fmt.Errorf("security page line %d: %q names no row whose %s cell can be repeated", line, c, Columns[col])
			}
			return other[col], nil
		}
		return c, nil
	}
	var err error
	if r.Publish, err = patternsOf(line, cells[0], cell, 2); err != nil {
		return r, err
	}
	if r.Subscribe, err = patternsOf(line, cells[0], cell, 3); err != nil {
		return r, err
	}
	answer, err := cell(4)
	if err != nil {
		return r, err
	}
	switch first, _, _ := strings.Cut(answer, " "); Replies(first) {
	case RepliesNone, RepliesOne, RepliesAny:
		r.Replies = Replies(first)
	default:
		return r, fmt.Errorf("security page line %d: the answer cell %q starts with none of no, one, any", line, answer)
	}
	reach, err := cell(5)
	if err != nil {
		return r, err
	}
	switch plain := ticked.ReplaceAllString(reach, ""); {
	case strings.Contains(plain, "every stream and bucket"):
		r.Reaches = []string{AllStreams}
	case reach == "none":
	default:
		r.Reaches = ticks(reach)
		if len(r.Reaches) == 0 {
			return r, fmt.Errorf("security page line %d: the streams cell %q names nothing in backticks and says neither \"every stream and bucket\" nor \"none\"", line, reach)
		}
	}
	slices.Sort(r.Reaches)
	return r, nil
}

func patternsOf(line int, who string, cell func(int) (string, error), col int) ([]string, error) {
	c, err := cell(col)
	if err != nil {
		return nil, err
	}
	ps := ticks(c)
	if len(ps) == 0 {
		return nil, fmt.Errorf("security page line %d (%s): the %s cell names no subject in backticks", line, who, Columns[col])
	}
	for _, p := range ps {
		for _, ph := range placeholderForm.FindAllString(p, -1) {
			if !slices.Contains([]string{PlaceholderNode, PlaceholderRun, PlaceholderProducer, PlaceholderTenant, PlaceholderConsumer, PlaceholderInvite}, ph) {
				return nil, fmt.Errorf("security page line %d (%s): %q holds the unknown placeholder %s", line, who, p, ph)
			}
		}
		if !ValidPattern(placeholderForm.ReplaceAllString(p, "x")) {
			return nil, fmt.Errorf("security page line %d (%s): %q is not a subject pattern", line, who, p)
		}
	}
	slices.Sort(ps)
	return slices.Compact(ps), nil
}

func ticks(cell string) []string {
	var out []string
	for _, m := range ticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// Instantiate replaces the placeholders of patterns with values (keyed by
// placeholder). A placeholder without a value stays as it is.
func Instantiate(patterns []string, values map[string]string) []string {
	out := make([]string, len(patterns))
	for i, p := range patterns {
		out[i] = placeholderForm.ReplaceAllStringFunc(p, func(ph string) string {
			if v, ok := values[ph]; ok {
				return v
			}
			return ph
		})
	}
	return out
}

// ValidPattern reports whether p is a subject or a subject pattern: non-empty
// tokens, no whitespace, `*` and `>` only as whole tokens, `>` last.
func ValidPattern(p string) bool {
	if p == "" || strings.ContainsAny(p, " \t\r\n") {
		return false
	}
	toks := strings.Split(p, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return false
		case t == ">" && i != len(toks)-1:
			return false
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return false
		}
	}
	return true
}

// Covers reports whether a client allowed pattern may use subject, which
// may itself be a pattern (a wildcard subscription): every subject subject
// matches, pattern matches too.
func Covers(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case p == "*":
			if st[i] == ">" {
				return false
			}
		case p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}

// Collide reports whether some subject matches both a and b.
func Collide(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; ; i++ {
		switch {
		case i == len(at) || i == len(bt):
			return len(at) == len(bt)
		case at[i] == ">" || bt[i] == ">":
			return true
		case at[i] == "*" || bt[i] == "*" || at[i] == bt[i]:
		default:
			return false
		}
	}
}
