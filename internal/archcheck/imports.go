package archcheck

import (
	"fmt"
	"slices"
	"strings"
)

// A Package is one of ours as `go list` describes it, paths relative to
// the module: its direct imports and all its dependencies.
type Package struct {
	Path    string
	Imports []string
	Deps    []string
}

// CheckImports holds every package to its row: each package has exactly one
// (an exact name wins over a subtree, a longer subtree over a shorter),
// each direct import of ours is one its row may import, no dependency,
// direct or not, is one its row says never, every package the table
// names exists, and every import a row lists is one of its packages'. It
// returns one line per violation.
func CheckImports(rows []Row, pkgs []Package) []string {
	var out []string
	known := make([]string, len(pkgs))
	for i, p := range pkgs {
		known[i] = p.Path
	}
	for _, r := range rows {
		for _, p := range slices.Concat(r.Packages, r.MayImport, r.Never) {
			if !slices.ContainsFunc(known, p.Matches) {
				out = append(out, fmt.Sprintf("line %d names `%s`, which is no package of the module", r.Line, p))
			}
		}
	}
	used := map[int][]string{} // a row's line: its packages' imports
	for _, p := range pkgs {
		r, err := rowOf(rows, p.Path)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		used[r.Line] = append(used[r.Line], p.Imports...)
		for _, d := range p.Imports {
			if !r.Anything && !slices.ContainsFunc(r.MayImport, func(q Pattern) bool { return q.Matches(d) }) {
				out = append(out, fmt.Sprintf("%s imports %s, which its row (line %d) does not list under may import", p.Path, d, r.Line))
			}
		}
		for _, d := range p.Deps {
			if slices.ContainsFunc(r.Never, func(q Pattern) bool { return q.Matches(d) }) {
				out = append(out, fmt.Sprintf("%s depends on %s, which its row (line %d) rules out", p.Path, d, r.Line))
			}
		}
	}
	for _, r := range rows {
		for _, q := range r.MayImport {
			if !slices.ContainsFunc(used[r.Line], q.Matches) {
				out = append(out, fmt.Sprintf("line %d lists `%s` under may import, which none of its packages imports: drop it", r.Line, q))
			}
		}
	}
	return out
}

// rowOf finds the one row naming pkg.
func rowOf(rows []Row, pkg string) (Row, error) {
	best, rank, tied := -1, -1, false
	for i, r := range rows {
		for _, p := range r.Packages {
			if !p.Matches(pkg) {
				continue
			}
			k := len(p.prefix()) // a subtree ranks by its prefix's length
			if !p.Subtree() {
				k = 1 << 20
			}
			switch {
			case k > rank:
				best, rank, tied = i, k, false
			case k == rank && i != best:
				tied = true
			}
		}
	}
	switch {
	case best < 0:
		return Row{}, fmt.Errorf("%s has no row in the package table: add one saying what it owns and may import", pkg)
	case tied:
		return Row{}, fmt.Errorf("%s is named by two rows of the package table equally: keep one", pkg)
	}
	return rows[best], nil
}

// Own keeps the paths under module and trims the module from them.
func Own(module string, paths []string) []string {
	var out []string
	for _, p := range paths {
		if rest, ok := strings.CutPrefix(p, module+"/"); ok {
			out = append(out, rest)
		}
	}
	return out
}
