package archcheck

import (
	"fmt"
	"regexp"
	"strings"
)

// A Pattern names one package ("bus") or a package and everything under
// it ("controlplane/…", also written "controlplane/...").
type Pattern string

// Subtree reports whether p covers the packages under its prefix too.
func (p Pattern) Subtree() bool {
	return strings.HasSuffix(string(p), "/…") || strings.HasSuffix(string(p), "/...")
}

func (p Pattern) prefix() string {
	s := strings.TrimSuffix(strings.TrimSuffix(string(p), "/…"), "/...")
	return s
}

// Matches reports whether p names pkg.
func (p Pattern) Matches(pkg string) bool {
	if p.Subtree() {
		return pkg == p.prefix() || strings.HasPrefix(pkg, p.prefix()+"/")
	}
	return pkg == string(p)
}

// A Row is one line of the package table.
type Row struct {
	Line      int       // in the page, from 1
	Packages  []Pattern // the first column
	Anything  bool      // "anything": its imports are not restricted
	MayImport []Pattern // the third column before "never"
	Never     []Pattern // after "never": not even through another package
}

var ticked = regexp.MustCompile("`([^`]+)`")

// ParseTable reads the table under the page's "## Packages" heading. A
// "may import" cell is "anything", "nothing of ours", or packages in
// backticks, optionally followed by "never" and the packages ruled out;
// any other words in it are notes. A cell naming no package in backticks
// and saying neither phrase is an error, so a row cannot go unchecked.
func ParseTable(page string) ([]Row, error) {
	var rows []Row
	in, header := false, 0
	for i, line := range strings.Split(page, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.TrimSpace(line) == "## Packages"
			continue
		case !in || !strings.HasPrefix(line, "|"):
			continue
		}
		if header < 2 { // the column names and the separator
			header++
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 3 {
			return nil, fmt.Errorf("architecture page line %d: %d columns, want 3 (package | owns | may import)", i+1, len(cells))
		}
		r, err := parseRow(i+1, cells[0], cells[2])
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("architecture page: no package table under \"## Packages\"")
	}
	return rows, nil
}

func parseRow(line int, pkgs, may string) (Row, error) {
	r := Row{Line: line, Packages: patterns(pkgs)}
	if len(r.Packages) == 0 {
		return r, fmt.Errorf("architecture page line %d: the package column names no package in backticks", line)
	}
	allowed, never, _ := strings.Cut(may, " never ")
	if strings.HasPrefix(strings.TrimSpace(may), "never ") {
		allowed, never = "", strings.TrimPrefix(strings.TrimSpace(may), "never ")
	}
	r.MayImport, r.Never = patterns(allowed), patterns(never)
	plain := ticked.ReplaceAllString(allowed, "")
	r.Anything = strings.Contains(plain, "anything")
	if len(r.MayImport) == 0 && !r.Anything && !strings.Contains(plain, "nothing of ours") {
		return r, fmt.Errorf("architecture page line %d: the may-import cell %q names no package and says neither \"anything\" nor \"nothing of ours\"", line, strings.TrimSpace(may))
	}
	return r, nil
}

func patterns(cell string) []Pattern {
	var out []Pattern
	for _, m := range ticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, Pattern(strings.TrimSpace(m[1])))
	}
	return out
}
